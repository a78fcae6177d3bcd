// build_legs() for POST /v1/responses (proto/responses_legs.h): the dialects' legs with the
// Responses API's spelling of the prefill cap.
#include "proto/responses_legs.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "proto/request_legs.h"

namespace pdr::proto {
namespace {

using nlohmann::json;

RandomSource Rng() {
  return [state = uint64_t{7}]() mutable { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
}

LegInstance Plain(Connector c, const char* host, uint16_t port) {
  LegInstance inst;
  inst.connector = c;
  inst.http_address = {host, port};
  inst.zmq_address = std::string(host) + ":" + std::to_string(port + 1000);
  return inst;
}

constexpr const char* kClient =
    R"({"model":"m","input":[{"role":"user","content":"hi"}],"max_output_tokens":20,"stream":true,)"
    R"("store":true,"background":true,"temperature":0.5})";

LegBuild Build(Connector c, const char* body = kClient) {
  LegBuild out;
  const Status st = build_legs({kResponsesPath, body, ""}, Plain(c, "127.0.20.1", 8100),
                               Plain(c, "127.0.20.2", 8200), std::nullopt, std::nullopt, LegOptions(), Rng(), &out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TEST(ResponsesLegs, NixlPrefillIsCappedWithMaxOutputTokens) {
  const LegBuild b = Build(Connector::kNixl);
  EXPECT_EQ(b.prefill.path, "/v1/responses");
  EXPECT_EQ(b.decode.path, "/v1/responses");
  const json p = json::parse(b.prefill.body_text());
  EXPECT_EQ(p["max_output_tokens"], 1);
  EXPECT_FALSE(p.contains("max_tokens"));
  EXPECT_FALSE(p.contains("max_completion_tokens"));
  EXPECT_EQ(p["stream"], false);
  EXPECT_EQ(p["store"], false);
  EXPECT_FALSE(p.contains("background"));
  EXPECT_EQ(p["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(p["input"], json::parse(kClient)["input"]);
  EXPECT_EQ(p["temperature"], 0.5);
  // The decode is the client's body, as for chat (NIXL completes it from the prefill's answer).
  const json d = json::parse(b.decode.body_text());
  EXPECT_EQ(d, json::parse(kClient));
}

TEST(ResponsesLegs, ThePrefillAnswersTopLevelKvTransferParamsForTheDecode) {
  LegBuild b = Build(Connector::kNixl);
  ASSERT_TRUE(finish_decode_leg(b.plan, &b.decode,
                                R"({"id":"resp_1","object":"response","output":[],)"
                                R"("kv_transfer_params":{"remote_block_ids":[1,2],"remote_engine_id":"e"}})")
                  .is_ok());
  const json d = json::parse(b.decode.body_text());
  EXPECT_EQ(d["kv_transfer_params"]["remote_block_ids"], json::array({1, 2}));
  EXPECT_EQ(d["max_output_tokens"], 20);
}

TEST(ResponsesLegs, EveryCappingDialectRespellsAndSglangIsLeftAlone) {
  for (Connector c : {Connector::kP2pNccl}) {
    const json p = json::parse(Build(c).prefill.body_text());
    EXPECT_EQ(p["max_output_tokens"], 1) << to_string(c);
    EXPECT_FALSE(p.contains("max_tokens")) << to_string(c);
  }
  const LegBuild s = Build(Connector::kSglang);
  const json p = json::parse(s.prefill.body_text());
  EXPECT_EQ(p["max_output_tokens"], 20);  // one body for both legs: nothing capped
  EXPECT_EQ(p["store"], true);
}

TEST(ResponsesLegs, AClientMaxTokensNeverReachesThePrefill) {
  const LegBuild b = Build(Connector::kNixl, R"({"input":"x","max_tokens":9})");
  const json p = json::parse(b.prefill.body_text());
  EXPECT_FALSE(p.contains("max_tokens"));
  EXPECT_EQ(p["max_output_tokens"], 1);
}

TEST(ResponsesLegs, ABadMaxOutputTokensIsRefused) {
  LegBuild out;
  const Status st = build_legs({kResponsesPath, R"({"input":"x","max_output_tokens":"5"})", ""},
                               Plain(Connector::kNixl, "127.0.20.1", 8100), Plain(Connector::kNixl, "127.0.20.2", 8200),
                               std::nullopt, std::nullopt, LegOptions(), Rng(), &out);
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  EXPECT_NE(st.message().find("max_output_tokens"), std::string::npos) << st.message();
  EXPECT_TRUE(build_legs({kResponsesPath, R"({"input":"x","max_output_tokens":null})", ""},
                         Plain(Connector::kNixl, "127.0.20.1", 8100), Plain(Connector::kNixl, "127.0.20.2", 8200),
                         std::nullopt, std::nullopt, LegOptions(), Rng(), &out)
                  .is_ok());
}

}  // namespace
}  // namespace pdr::proto
