#include "proto/multi_turn.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

TEST(MultiTurn, FindsTheDecodesKvTransferParams) {
  const JsonLimits limits;
  const std::string chunk =
      R"({"id":"x","choices":[],"kv_transfer_params":{"remote_block_ids":[[1,2]],"remote_engine_id":"e"}})";
  auto params = kv_transfer_params_of(chunk, limits);
  ASSERT_TRUE(params.has_value());
  EXPECT_EQ(*params, R"({"remote_block_ids":[[1,2]],"remote_engine_id":"e"})");
  for (std::string_view none : {R"({"kv_transfer_params":null})", R"({"kv_transfer_params":{}})",
                                R"({"kv_transfer_params":[1]})", R"({"choices":[]})", "[DONE]", "{",
                                R"({"kv_transfer_params":{"a":1},"kv_transfer_params":{"a":2}})"}) {
    EXPECT_FALSE(kv_transfer_params_of(none, limits).has_value()) << none;
  }
}

TEST(MultiTurn, TheNextPrefillPullsFromTheDecode) {
  std::string out;
  ASSERT_TRUE(next_turn_prefill_params(
                  R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[4]],)"
                  R"("remote_engine_id":"dec","remote_host":"127.0.30.9","remote_port":5600,"remote_request_id":"r",)"
                  R"("tp_size":1,"new_field":"kept"})",
                  "127.0.30.2", JsonLimits{}, &out)
                  .is_ok());
  JsonObjectBody body;
  ASSERT_TRUE(JsonObjectBody::parse(out, JsonLimits{}, &body).is_ok()) << out;
  EXPECT_EQ(body.get_raw("do_remote_decode"), "true");
  EXPECT_EQ(body.get_raw("do_remote_prefill"), "false");
  EXPECT_EQ(body.get_raw("remote_host"), "\"127.0.30.9\"");  // the decode's word, judged at reuse
  EXPECT_EQ(body.get_raw("remote_block_ids"), "[[4]]");
  EXPECT_EQ(body.get_raw("remote_port"), "5600");
  EXPECT_EQ(body.get_raw("new_field"), "\"kept\"");
  // No side channel named (absent or null): the decode's registered host, as vLLM's proxy sets.
  for (std::string_view params : {R"({"remote_block_ids":[[4]],"remote_engine_id":"dec"})",
                                  R"({"remote_block_ids":[[4]],"remote_engine_id":"dec","remote_host":null})"}) {
    ASSERT_TRUE(next_turn_prefill_params(params, "127.0.30.2", JsonLimits{}, &out).is_ok()) << params;
    ASSERT_TRUE(JsonObjectBody::parse(out, JsonLimits{}, &body).is_ok()) << out;
    EXPECT_EQ(body.get_raw("remote_host"), "\"127.0.30.2\"") << params;
  }
  EXPECT_EQ(next_turn_prefill_params(R"({"remote_block_ids":[[4]],"remote_engine_id":"dec","remote_host":7})",
                                     "127.0.30.2", JsonLimits{}, &out)
                .code(),
            StatusCode::kWrongType);
}

// The next prefill connects to the params' remote_host: only the decode's own host, or a loopback
// host when prefill and decode registered the same host. Other hosts are spelled with names under
// .invalid (RFC 6761: they never resolve); nothing here connects anywhere.
TEST(MultiTurn, TheNextPrefillIsAimedOnlyAtTheDecode) {
  const auto check = [](std::string_view host_json, std::string_view decode, std::string_view prefill) {
    const std::string params =
        R"({"remote_block_ids":[[4]],"remote_engine_id":"dec","remote_port":5600,"remote_host":)" +
        std::string(host_json) + "}";
    return check_next_turn_remote_host(params, decode, prefill, JsonLimits{});
  };
  EXPECT_TRUE(check(R"("node-d.invalid")", "node-d.invalid", "node-p.invalid").is_ok());
  EXPECT_TRUE(check(R"("NODE-D.invalid.")", "node-d.invalid", "node-p.invalid").is_ok());
  EXPECT_TRUE(check(R"("127.0.0.1")", "127.0.30.2", "127.0.30.3").is_ok());  // one machine, both loopback
  EXPECT_TRUE(check(R"("localhost")", "node-d.invalid", "node-d.invalid").is_ok());  // prefill on the decode's host
  for (std::string_view host : {R"("victim.invalid")", R"("localhost")", R"("127.0.0.1")", R"("fd00::2")"}) {
    const Status st = check(host, "node-d.invalid", "node-p.invalid");
    EXPECT_EQ(st.code(), StatusCode::kRejected) << host;
    EXPECT_NE(st.message().find("not the decode's own host 'node-d.invalid'"), std::string::npos) << st.message();
  }
  EXPECT_EQ(check("null", "127.0.0.1", "127.0.0.1").code(), StatusCode::kWrongType);
  EXPECT_EQ(check("5", "127.0.0.1", "127.0.0.1").code(), StatusCode::kWrongType);
  EXPECT_FALSE(check_next_turn_remote_host("{", "127.0.0.1", "127.0.0.1", JsonLimits{}).is_ok());
}

TEST(MultiTurn, ParamsWithoutBlocksAreNotReusable) {
  std::string out;
  EXPECT_EQ(next_turn_prefill_params(R"({"remote_engine_id":"dec"})", "127.0.0.1", JsonLimits{}, &out).code(),
            StatusCode::kMissingKey);
  EXPECT_EQ(next_turn_prefill_params(R"({"remote_engine_id":"dec","remote_block_ids":null})", "127.0.0.1",
                                     JsonLimits{}, &out)
                .code(),
            StatusCode::kMissingKey);
  EXPECT_FALSE(next_turn_prefill_params("not json", "127.0.0.1", JsonLimits{}, &out).is_ok());
}

}  // namespace
}  // namespace pdr::proto
