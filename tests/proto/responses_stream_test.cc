// proto/responses_stream.h: the Responses API's failure events and what they continue from.
#include "proto/responses_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace pdr::proto {
namespace {

// vLLM's framing: "event: <type>\ndata: <json>\n\n" (api_router.py).
std::string event(const std::string& type, const std::string& json) {
  return "event: " + type + "\ndata: " + json + "\n\n";
}

// The (event name, data JSON) pairs of a stream text.
std::vector<std::pair<std::string, nlohmann::json>> parse(const std::string& text) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << text;
    if (end == std::string::npos) break;
    const std::string block = text.substr(at, end - at);
    at = end + 2;
    const size_t nl = block.find('\n');
    EXPECT_EQ(block.substr(0, 7), "event: ");
    EXPECT_EQ(block.substr(nl + 1, 6), "data: ");
    out.emplace_back(block.substr(7, nl - 7), nlohmann::json::parse(block.substr(nl + 7)));
  }
  return out;
}

TEST(ResponsesStream, FailureIsAnErrorEventThenResponseFailedWithoutDone) {
  const std::string text = responses_failure_events("resp_abc", 7, "decode failed: \"x\"\n", "decode_failed");
  EXPECT_EQ(text.find("[DONE]"), std::string::npos);
  EXPECT_TRUE(text.ends_with("\n\n"));
  const auto events = parse(text);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].first, "error");
  EXPECT_EQ(events[0].second["type"], "error");
  EXPECT_EQ(events[0].second["code"], "decode_failed");
  EXPECT_EQ(events[0].second["message"], "decode failed: \"x\"\n");
  EXPECT_TRUE(events[0].second["param"].is_null());
  EXPECT_EQ(events[0].second["sequence_number"], 7);
  EXPECT_EQ(events[1].first, "response.failed");
  EXPECT_EQ(events[1].second["type"], "response.failed");
  EXPECT_EQ(events[1].second["sequence_number"], 8);
  const auto& response = events[1].second["response"];
  EXPECT_EQ(response["id"], "resp_abc");
  EXPECT_EQ(response["object"], "response");
  EXPECT_EQ(response["status"], "failed");
  EXPECT_EQ(response["error"]["code"], "server_error");
  EXPECT_EQ(response["error"]["message"], "decode failed: \"x\"\n");
}

TEST(ResponsesStream, FollowerLearnsTheIdAndTheNextNumber) {
  ResponsesStreamFollower f;
  EXPECT_EQ(f.next_sequence_number(), 0);
  EXPECT_EQ(f.response_id(), "");
  // pydantic's order (vLLM): the response object first, its id first in it.
  f.observe(event("response.created",
                  R"({"response":{"id":"resp_42","created_at":1,"output":[],"status":"in_progress"},)"
                  R"("sequence_number":0,"type":"response.created"})") +
            event("response.in_progress", R"({"response":{"id":"resp_42"},"sequence_number":1,"type":"response.in_progress"})"));
  EXPECT_EQ(f.response_id(), "resp_42");
  EXPECT_EQ(f.next_sequence_number(), 2);
  f.observe(event("response.output_text.delta",
                  R"({"item_id":"msg_1","delta":"hi","sequence_number" : 12,"type":"response.output_text.delta"})"));
  EXPECT_EQ(f.next_sequence_number(), 13);
  EXPECT_EQ(f.response_id(), "resp_42");  // an item's id never replaces it
}

TEST(ResponsesStream, FollowerReadsKeysSortedByName) {
  // nlohmann's dump (the simulator) sorts keys: "id" comes after other members of the response.
  ResponsesStreamFollower f;
  f.observe(event("response.created",
                  R"({"response":{"background":false,"created_at":1,"id":"resp_x-1","model":"m"},)"
                  R"("sequence_number":0,"type":"response.created"})"));
  EXPECT_EQ(f.response_id(), "resp_x-1");
  EXPECT_EQ(f.next_sequence_number(), 1);
}

TEST(ResponsesStream, FollowerIgnoresWhatDoesNotLookRight) {
  ResponsesStreamFollower f;
  f.observe(event("response.created", R"({"response":{"id":"resp_\"<script>"},"sequence_number":99999999999999999999})"));
  EXPECT_EQ(f.response_id(), "");
  EXPECT_EQ(f.next_sequence_number(), 0);
  f.observe(event("response.created", R"({"response":{"id":")" + std::string(200, 'a') + R"("},"sequence_number":-3})"));
  EXPECT_EQ(f.response_id(), "");
  EXPECT_EQ(f.next_sequence_number(), 0);
  f.observe("data: {\"sequence_number\":");  // cut short
  EXPECT_EQ(f.next_sequence_number(), 0);
  f.observe("");
  EXPECT_EQ(f.next_sequence_number(), 0);
  // A later good number still counts.
  f.observe(event("response.in_progress", R"({"sequence_number":4})"));
  EXPECT_EQ(f.next_sequence_number(), 5);
}

}  // namespace
}  // namespace pdr::proto
