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
  EXPECT_EQ(body.get_raw("remote_host"), "\"127.0.30.2\"");
  EXPECT_EQ(body.get_raw("remote_block_ids"), "[[4]]");
  EXPECT_EQ(body.get_raw("remote_port"), "5600");
  EXPECT_EQ(body.get_raw("new_field"), "\"kept\"");
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
