#include "node/sim/faults.h"

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

FaultSpec parse_ok(const char* body) {
  FaultSpec fault;
  auto error = parse_fault(body, &fault);
  EXPECT_FALSE(error.has_value()) << body << ": " << error.value_or("");
  return fault;
}

std::string parse_error(const char* body) {
  FaultSpec fault;
  auto error = parse_fault(body, &fault);
  EXPECT_TRUE(error.has_value()) << body;
  return error.value_or("");
}

TEST(ParseFault, EachAction) {
  FaultSpec f = parse_ok(R"({"status":503})");
  EXPECT_EQ(f.action, FaultSpec::Action::kStatus);
  EXPECT_EQ(f.status, 503);
  EXPECT_EQ(f.count, 1);
  EXPECT_FALSE(f.path.has_value());

  EXPECT_EQ(parse_ok(R"({"hang":true})").action, FaultSpec::Action::kHang);
  EXPECT_EQ(parse_ok(R"({"stop_after_first_token":true})").action,
            FaultSpec::Action::kStopAfterFirstToken);
  EXPECT_EQ(parse_ok(R"({"stop_after_first_token":true})").to_json(), R"({"stop_after_first_token":true})");
  EXPECT_EQ(parse_ok(R"({"close_immediately":true})").action,
            FaultSpec::Action::kCloseImmediately);
  f = parse_ok(R"({"close_after_tokens":3})");
  EXPECT_EQ(f.action, FaultSpec::Action::kCloseAfterTokens);
  EXPECT_EQ(f.close_after_tokens, 3u);
  f = parse_ok(R"({"delay_ms":250})");
  EXPECT_EQ(f.action, FaultSpec::Action::kNone);
  EXPECT_EQ(f.delay_ms, 250u);
}

TEST(ParseFault, DelayCombinesAndCountAndPath) {
  FaultSpec f = parse_ok(R"({"status":500,"delay_ms":20,"count":-1,"path":"/v1/completions"})");
  EXPECT_EQ(f.action, FaultSpec::Action::kStatus);
  EXPECT_EQ(f.delay_ms, 20u);
  EXPECT_EQ(f.count, -1);
  EXPECT_EQ(f.path, "/v1/completions");
  EXPECT_EQ(f.to_json(), R"({"delay_ms":20,"path":"/v1/completions","status":500})");
  // false flags are allowed and mean "not this action".
  EXPECT_EQ(parse_ok(R"({"hang":false,"status":502})").action, FaultSpec::Action::kStatus);
}

TEST(ParseFault, RefusesBadBodies) {
  EXPECT_EQ(parse_error("{nope"), "fault body is not valid JSON");
  EXPECT_EQ(parse_error("[1]"), "fault body must be a JSON object");
  EXPECT_NE(parse_error(R"({"status":500,"colour":"red"})").find("unknown key 'colour'"),
            std::string::npos);
  EXPECT_EQ(parse_error(R"({"status":"500"})"), "status must be an integer");
  EXPECT_EQ(parse_error(R"({"status":500.0})"), "status must be an integer");
  EXPECT_EQ(parse_error(R"({"status":200})"), "status must be in 400..599");
  EXPECT_EQ(parse_error(R"({"hang":1})"), "hang must be a boolean");
  EXPECT_EQ(parse_error(R"({"close_after_tokens":-1})"), "close_after_tokens must be in 0..1000000");
  EXPECT_EQ(parse_error(R"({"delay_ms":18446744073709551615})"), "delay_ms must be in 0..600000");
  EXPECT_EQ(parse_error(R"({"status":500,"count":0})"),
            "count must be -1 (until cleared) or at least 1");
  EXPECT_EQ(parse_error(R"({"status":500,"count":-2})").substr(0, 13), "count must be");
  EXPECT_EQ(parse_error(R"({"status":500,"path":5})"), "path must be a string");
  EXPECT_EQ(parse_error(R"({"status":500,"path":"v1"})"), "path must start with '/'");
  EXPECT_EQ(parse_error(R"({"status":500,"path":"/sim/requests"})"),
            "path must not be a /sim/ test endpoint");
  EXPECT_NE(parse_error(R"({"status":500,"hang":true})").find("mutually exclusive"),
            std::string::npos);
  EXPECT_NE(parse_error(R"({})").find("needs one of"), std::string::npos);
  EXPECT_NE(parse_error(R"({"count":2})").find("needs one of"), std::string::npos);
  EXPECT_NE(parse_error(R"({"hang":false})").find("needs one of"), std::string::npos);
}

TEST(FaultSpec, DefaultPathsAreTheGenerationEndpoints) {
  FaultSpec f;
  EXPECT_TRUE(f.matches("/v1/completions"));
  EXPECT_TRUE(f.matches("/v1/chat/completions"));
  EXPECT_FALSE(f.matches("/health"));
  f.path = "/health";
  EXPECT_TRUE(f.matches("/health"));
  EXPECT_FALSE(f.matches("/v1/completions"));
}

TEST(FaultQueue, TakesInOrderAndCountsUses) {
  FaultQueue queue;
  EXPECT_FALSE(queue.take("/v1/completions"));
  FaultSpec first = parse_ok(R"({"status":500,"count":2})");
  FaultSpec second = parse_ok(R"({"status":503})");
  queue.push(first);
  queue.push(second);
  EXPECT_EQ(queue.take("/v1/completions")->status, 500);
  EXPECT_EQ(queue.take("/v1/chat/completions")->status, 500);
  EXPECT_EQ(queue.take("/v1/completions")->status, 503);
  EXPECT_FALSE(queue.take("/v1/completions"));
  EXPECT_EQ(queue.size(), 0u);
}

TEST(FaultQueue, PathFilterSkipsToTheFirstMatch) {
  FaultQueue queue;
  queue.push(parse_ok(R"({"status":501,"path":"/v1/chat/completions"})"));
  queue.push(parse_ok(R"({"status":502})"));
  EXPECT_FALSE(queue.take("/health"));
  EXPECT_EQ(queue.take("/v1/completions")->status, 502);
  EXPECT_FALSE(queue.take("/v1/completions"));
  EXPECT_EQ(queue.take("/v1/chat/completions")->status, 501);
}

TEST(FaultQueue, UntilClearedAndJson) {
  FaultQueue queue;
  queue.push(parse_ok(R"({"hang":true,"count":-1})"));
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(queue.take("/v1/completions"));
  EXPECT_EQ(queue.to_json(), R"({"faults":[{"count":-1,"hang":true}]})");
  queue.clear();
  EXPECT_FALSE(queue.take("/v1/completions"));
  EXPECT_EQ(queue.to_json(), R"({"faults":[]})");
}

}  // namespace
}  // namespace pdr::node::sim
