// vLLM's tokens-in /inference/v1/generate split into legs (proto/generate_request.h through
// build_legs): the token counts and a copy of kv_transfer_params live in sampling_params.
#include "proto/generate_request.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "proto/request_legs.h"

namespace pdr::proto {
namespace {

using nlohmann::json;

// Addresses are in 127.0.0.0/8; nothing connects to them.

RandomSource Rng(uint64_t seed = 7) {
  return [state = seed]() mutable {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
}

// A render answer plus sampling_params, as the seed's example_mm_serve.py sends it.
const std::string kBody =
    R"({"request_id":"r-1","token_ids":[101, 7, 0, 4294967295],"features":{"mm_hashes":{"image":["h"]},)"
    R"("mm_placeholders":{"image":[{"offset":1,"length":2}]},"kwargs_data":{"image":["QUFB"]}},)"
    R"("model":"m","kv_transfer_params":null,"stream":true,)"
    R"("sampling_params":{"max_tokens":20,"min_tokens":3,"temperature":0.0,"extra_args":{"keep":[1]}}})";

LegInstance Node(Connector c, const char* host, uint16_t port) {
  LegInstance inst;
  inst.connector = c;
  inst.http_address = {host, port};
  inst.zmq_address = std::string(host) + ":" + std::to_string(port + 1000);
  return inst;
}

LegInstance Moriio(const char* host, uint16_t http) {
  LegInstance inst = Node(Connector::kMoriio, host, http);
  inst.transfer_mode = TransferMode::kRead;
  inst.moriio_zmq = MoriioZmqAddress{host, static_cast<uint16_t>(http + 1), static_cast<uint16_t>(http + 2)};
  inst.zmq_address = inst.moriio_zmq->to_string();
  return inst;
}

Status Build(const std::string& body, const LegInstance& p, const LegInstance& d, LegBuild* out) {
  return build_legs({kGeneratePath, body, ""}, p, d, std::nullopt, std::nullopt, LegOptions(), Rng(), out);
}

Status Check(const std::string& body, int64_t* choices = nullptr) {
  JsonObjectBody parsed;
  if (Status st = JsonObjectBody::parse(body, JsonLimits(), &parsed); !st) return st;
  int64_t n = 0;
  Status st = check_generate_request(parsed, JsonLimits(), &n);
  if (choices != nullptr) *choices = n;
  return st;
}

TEST(GenerateRequest, AcceptsTheSeedsRenderAnswerWithSamplingParams) {
  int64_t choices = 0;
  EXPECT_TRUE(Check(kBody, &choices).is_ok()) << Check(kBody).to_string();
  EXPECT_EQ(choices, 1);
  EXPECT_TRUE(Check(R"({"token_ids":[1],"sampling_params":{"n":3}})", &choices).is_ok());
  EXPECT_EQ(choices, 3);
  EXPECT_TRUE(Check(R"({"token_ids":[ 0 ],"sampling_params":{"max_tokens":null,"extra_args":null},"model":null})")
                  .is_ok());
}

TEST(GenerateRequest, RefusesBadBodiesNamingTheField) {
  struct Case {
    const char* body;
    StatusCode code;
    const char* in_message;
  };
  const Case cases[] = {
      {R"({"sampling_params":{}})", StatusCode::kMissingKey, "token_ids is required"},
      {R"({"token_ids":null,"sampling_params":{}})", StatusCode::kMissingKey, "token_ids is required"},
      {R"({"token_ids":"1 2","sampling_params":{}})", StatusCode::kWrongType, "token_ids must be an array"},
      {R"({"token_ids":[],"sampling_params":{}})", StatusCode::kInvalidValue, "must not be empty"},
      {R"({"token_ids":[1,-2],"sampling_params":{}})", StatusCode::kWrongType, "token_ids[1]"},
      {R"({"token_ids":[1.5],"sampling_params":{}})", StatusCode::kWrongType, "token_ids[0]"},
      {R"({"token_ids":[1,[2]],"sampling_params":{}})", StatusCode::kWrongType, "token_ids[1]"},
      {R"({"token_ids":["a"],"sampling_params":{}})", StatusCode::kWrongType, "token_ids[0]"},
      {R"({"token_ids":[4294967296],"sampling_params":{}})", StatusCode::kOutOfRange, "below 2^32"},
      {R"({"token_ids":[1]})", StatusCode::kMissingKey, "sampling_params is required"},
      {R"({"token_ids":[1],"sampling_params":[1]})", StatusCode::kWrongType, "sampling_params must be an object"},
      {R"({"token_ids":[1],"sampling_params":{"max_tokens":0}})", StatusCode::kOutOfRange,
       "sampling_params.max_tokens must be at least 1"},
      {R"({"token_ids":[1],"sampling_params":{"max_tokens":"9"}})", StatusCode::kWrongType,
       "sampling_params.max_tokens"},
      {R"({"token_ids":[1],"sampling_params":{"n":0}})", StatusCode::kOutOfRange, "sampling_params.n"},
      {R"({"token_ids":[1],"sampling_params":{"min_tokens":-1}})", StatusCode::kOutOfRange,
       "sampling_params.min_tokens"},
      {R"({"token_ids":[1],"sampling_params":{"extra_args":3}})", StatusCode::kWrongType,
       "sampling_params.extra_args must be an object"},
      {R"({"token_ids":[1],"sampling_params":{"extra_args":{"kv_transfer_params":"x"}}})", StatusCode::kWrongType,
       "sampling_params.extra_args.kv_transfer_params"},
      {R"({"token_ids":[1],"sampling_params":{},"model":5})", StatusCode::kWrongType, "model must be a string"},
      {R"({"token_ids":[1],"sampling_params":{},"stream":"yes"})", StatusCode::kWrongType, "stream must be a boolean"},
      {R"({"token_ids":[1],"sampling_params":{},"kv_transfer_params":[]})", StatusCode::kWrongType,
       "kv_transfer_params must be an object"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const Status st = Check(c.body);
    EXPECT_EQ(st.code(), c.code) << st.to_string();
    EXPECT_NE(st.message().find(c.in_message), std::string::npos) << st.message();
  }
}

TEST(GenerateRequest, BoundsTheNumberOfTokenIds) {
  std::string ids = "[0";
  for (size_t i = 1; i <= kMaxGenerateTokenIds; ++i) ids += ",1";
  ids += "]";
  JsonLimits limits;
  limits.max_bytes = 64 << 20;
  JsonObjectBody parsed;
  ASSERT_TRUE(JsonObjectBody::parse(R"({"sampling_params":{},"token_ids":)" + ids + "}", limits, &parsed).is_ok());
  int64_t n = 0;
  EXPECT_EQ(check_generate_request(parsed, limits, &n).code(), StatusCode::kTooLarge);
}

TEST(GenerateLegs, NixlPrefillCapsSamplingParamsAndCarriesParamsInBothPlaces) {
  LegBuild b;
  ASSERT_TRUE(Build(kBody, Node(Connector::kNixl, "127.0.20.1", 8100), Node(Connector::kNixl, "127.0.20.2", 8200), &b)
                  .is_ok());
  EXPECT_TRUE(b.plan.tokens_in);
  EXPECT_EQ(b.prefill.path, kGeneratePath);
  EXPECT_EQ(b.decode.path, kGeneratePath);
  const json client = json::parse(kBody);
  const json pre = json::parse(b.prefill.body_text());
  EXPECT_EQ(pre["sampling_params"]["max_tokens"], 1);
  EXPECT_FALSE(pre["sampling_params"].contains("min_tokens"));
  EXPECT_EQ(pre["sampling_params"]["temperature"], 0.0);
  EXPECT_FALSE(pre.contains("max_tokens")) << "no top-level max_tokens: vLLM reads sampling_params";
  EXPECT_FALSE(pre.contains("min_tokens"));
  EXPECT_EQ(pre["stream"], false);
  EXPECT_EQ(pre["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(pre["sampling_params"]["extra_args"]["kv_transfer_params"], pre["kv_transfer_params"]);
  EXPECT_EQ(pre["sampling_params"]["extra_args"]["keep"], json::array({1}));
  for (const char* key : {"token_ids", "features", "model", "request_id"}) EXPECT_EQ(pre[key], client[key]) << key;

  const std::string params = R"({"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[[1]]})";
  ASSERT_TRUE(finish_decode_leg(b.plan, &b.decode,
                                R"({"request_id":"x","choices":[{"index":0,"token_ids":[5]}],"kv_transfer_params":)" +
                                    params + "}")
                  .is_ok());
  const json dec = json::parse(b.decode.body_text());
  EXPECT_EQ(dec["kv_transfer_params"], json::parse(params));
  EXPECT_EQ(dec["sampling_params"]["extra_args"]["kv_transfer_params"], json::parse(params));
  EXPECT_EQ(dec["sampling_params"]["max_tokens"], 20);
  EXPECT_EQ(dec["sampling_params"]["min_tokens"], 3);
  EXPECT_EQ(dec["stream"], true);
  EXPECT_FALSE(dec.contains("max_tokens"));

  // The no-KV fallback drops the params from both places.
  ASSERT_TRUE(decode_without_kv(b.plan, &b.decode));
  const json plain = json::parse(b.decode.body_text());
  EXPECT_FALSE(plain.contains("kv_transfer_params"));
  EXPECT_FALSE(plain["sampling_params"]["extra_args"].contains("kv_transfer_params"));
  EXPECT_EQ(plain["sampling_params"]["extra_args"]["keep"], json::array({1}));
}

TEST(GenerateLegs, TopLevelTokenCountsOfTheClientAreLeftAlone) {
  // vLLM ignores a top-level max_tokens on this endpoint: it neither caps nor feeds sampling_params.
  const std::string body = R"({"token_ids":[1,2],"max_tokens":50,"sampling_params":{"temperature":1}})";
  LegBuild b;
  ASSERT_TRUE(Build(body, Node(Connector::kNixl, "127.0.20.1", 8100), Node(Connector::kNixl, "127.0.20.2", 8200), &b)
                  .is_ok());
  const json pre = json::parse(b.prefill.body_text());
  EXPECT_EQ(pre["max_tokens"], 50);
  EXPECT_EQ(pre["sampling_params"]["max_tokens"], 1);
  EXPECT_EQ(pre["sampling_params"]["extra_args"]["kv_transfer_params"], pre["kv_transfer_params"]);
  const json dec = json::parse(b.decode.body_text());
  EXPECT_FALSE(dec["sampling_params"].contains("max_tokens"));
  EXPECT_EQ(dec["max_tokens"], 50);
}

TEST(GenerateLegs, MoriioDecodeCountsDownInSamplingParams) {
  LegBuild b;
  ASSERT_TRUE(Build(kBody, Moriio("127.0.20.1", 8100), Moriio("127.0.20.2", 8200), &b).is_ok());
  const json pre = json::parse(b.prefill.body_text());
  const json dec = json::parse(b.decode.body_text());
  EXPECT_EQ(pre["sampling_params"]["max_tokens"], 1);
  EXPECT_EQ(dec["sampling_params"]["max_tokens"], 19);
  EXPECT_EQ(pre["sampling_params"]["extra_args"]["kv_transfer_params"], pre["kv_transfer_params"]);
  EXPECT_EQ(dec["sampling_params"]["extra_args"]["kv_transfer_params"], dec["kv_transfer_params"]);
  EXPECT_FALSE(dec.contains("max_tokens"));
}

TEST(GenerateLegs, P2pNcclDropsAClientsOwnParamsFromBothPlaces) {
  const std::string body =
      R"({"token_ids":[1],"kv_transfer_params":{"x":1},)"
      R"("sampling_params":{"max_tokens":4,"extra_args":{"kv_transfer_params":{"x":1}}}})";
  LegBuild b;
  ASSERT_TRUE(
      Build(body, Node(Connector::kP2pNccl, "127.0.20.1", 8100), Node(Connector::kP2pNccl, "127.0.20.2", 8200), &b)
          .is_ok());
  for (const LegRequest* leg : {&b.prefill, &b.decode}) {
    const json j = json::parse(leg->body_text());
    EXPECT_FALSE(j.contains("kv_transfer_params"));
    EXPECT_FALSE(j["sampling_params"]["extra_args"].contains("kv_transfer_params"));
  }
  EXPECT_EQ(json::parse(b.prefill.body_text())["sampling_params"]["max_tokens"], 1);
  EXPECT_EQ(json::parse(b.decode.body_text())["sampling_params"]["max_tokens"], 4);
}

TEST(GenerateLegs, SglangIsRefusedWithItsReason) {
  LegBuild b;
  LegInstance p = Node(Connector::kSglang, "127.0.20.1", 8100);
  p.bootstrap_port = 8998;
  const Status st = Build(kBody, p, Node(Connector::kSglang, "127.0.20.2", 8200), &b);
  EXPECT_EQ(st.code(), StatusCode::kRejected);
  EXPECT_NE(st.message().find("/inference/v1/generate"), std::string::npos) << st.message();
}

TEST(GenerateLegs, EveryDialectEitherServesItOrSaysWhy) {
  for (const Dialect* d : all_dialects()) {
    SCOPED_TRACE(d->name);
    if (d->connector == Connector::kSglang) {
      EXPECT_FALSE(d->tokens_in_unsupported.empty());
    } else {
      EXPECT_TRUE(d->tokens_in_unsupported.empty());
    }
  }
}

TEST(GenerateLegs, BadBodiesAreTheClientsFault) {
  LegBuild b;
  const Status st = Build(R"({"token_ids":[-1],"sampling_params":{}})", Node(Connector::kNixl, "127.0.20.1", 8100),
                          Node(Connector::kNixl, "127.0.20.2", 8200), &b);
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
}

// Parse once (#12): admission's check (check_generate_request into a GenerateView) indexes the
// client's sampling_params and its extra_args; building the legs from that view (and rebuilding
// them for a retry) parses nothing, and gives exactly the legs build_legs makes on its own.
TEST(GenerateParseOnce, LegsAreBuiltFromTheAdmissionCheck) {
  const LegInstance pairs[][2] = {
      {Node(Connector::kNixl, "127.0.20.1", 8100), Node(Connector::kNixl, "127.0.20.2", 8200)},
      {Moriio("127.0.20.1", 8100), Moriio("127.0.20.2", 8200)},
      {Node(Connector::kP2pNccl, "127.0.20.1", 8100), Node(Connector::kP2pNccl, "127.0.20.2", 8200)},
  };
  const std::string bodies[] = {
      kBody,
      R"({"token_ids":[1,2],"sampling_params":{"max_tokens":9}})",
      R"({"token_ids":[1],"sampling_params":{ "min_tokens" : 3 , "temperature":0 },"max_tokens":5})",
      R"({"token_ids":[1],"kv_transfer_params":{"x":1},"sampling_params":{"extra_args":{"kv_transfer_params":{"x":1}}}})",
      R"({"token_ids":[1],"sampling_params":{"max_tokens":null,"extra_args":null}})",
  };
  for (const std::string& body : bodies) {
    for (const auto& pair : pairs) {
      SCOPED_TRACE(body + " " + std::string(to_string(pair[0].connector)));
      JsonObjectBody client;
      ASSERT_TRUE(JsonObjectBody::parse(body, JsonLimits(), &client).is_ok());
      GenerateView view;
      const uint64_t before_check = json_object_parses();
      ASSERT_TRUE(check_generate_request(client, JsonLimits(), &view).is_ok());
      EXPECT_EQ(json_object_parses() - before_check, view.has_extra_args ? 2u : 1u)
          << "sampling_params, and extra_args when it is an object";

      const uint64_t before = json_object_parses();
      LegBuild built, again;
      const ClientRequest request{kGeneratePath, body, "", &client, &view};
      ASSERT_TRUE(build_legs(request, pair[0], pair[1], std::nullopt, std::nullopt, LegOptions(), Rng(), &built)
                      .is_ok());
      ASSERT_TRUE(build_legs(request, pair[0], pair[1], std::nullopt, std::nullopt, LegOptions(), Rng(), &again)
                      .is_ok());
      EXPECT_EQ(json_object_parses(), before) << "no parse when building the legs from the view";

      LegBuild alone;
      ASSERT_TRUE(Build(body, pair[0], pair[1], &alone).is_ok());
      EXPECT_EQ(built.prefill.body_text(), alone.prefill.body_text());
      EXPECT_EQ(built.decode.body_text(), alone.decode.body_text());
      EXPECT_EQ(again.decode.body_text(), alone.decode.body_text());
    }
  }
}

TEST(GenerateParseOnce, AnUnchangedSamplingParamsKeepsTheClientsBytes) {
  // The NIXL decode leg carries the client's sampling_params as it came (spacing and all): it is
  // not rendered again when no edit touched it.
  const std::string body = R"({"token_ids":[1], "sampling_params" : { "max_tokens" : 7 ,"seed":3 } })";
  LegBuild b;
  ASSERT_TRUE(Build(body, Node(Connector::kNixl, "127.0.20.1", 8100), Node(Connector::kNixl, "127.0.20.2", 8200), &b)
                  .is_ok());
  EXPECT_EQ(b.decode.body_text(), body);
  EXPECT_EQ(b.decode.body.get_raw("sampling_params"), R"({ "max_tokens" : 7 ,"seed":3 })");
}

}  // namespace
}  // namespace pdr::proto
