// Anthropic's Messages API (proto/anthropic_messages.h): what pdrouter refuses itself, its error
// shape per status, and build_legs() for POST /v1/messages in every dialect.
#include "proto/anthropic_messages.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

#include "proto/request_legs.h"
#include "proto/responses_legs.h"

namespace pdr::proto {
namespace {

using nlohmann::json;

RandomSource Rng() {
  return [state = uint64_t{11}]() mutable { return state = state * 6364136223846793005ULL + 1442695040888963407ULL; };
}

constexpr const char* kClient =
    R"({"model":"m","max_tokens":20,"stream":true,"system":"be brief",)"
    R"("messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],)"
    R"("temperature":0.5,"metadata":{"user_id":"u"}})";

Status Check(const std::string& body) {
  JsonObjectBody parsed;
  if (Status st = JsonObjectBody::parse(body, JsonLimits(), &parsed); !st) return st;
  return check_messages_request(parsed);
}

TEST(AnthropicMessages, AcceptsWhatAnthropicsSdkSends) {
  EXPECT_TRUE(Check(kClient).is_ok()) << Check(kClient).to_string();
  EXPECT_TRUE(Check(R"({"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}]})").is_ok());
  EXPECT_TRUE(Check(R"({"model":"m","max_tokens":1,"messages":[ {} ],"stream":null})").is_ok());
  EXPECT_TRUE(Check(R"({"model":"m","max_tokens":9223372036854775807,"messages":[1],"stream":false})").is_ok());
}

TEST(AnthropicMessages, RefusesWhatVllmWouldRefuseAfterThePrefill) {
  const struct {
    const char* body;
    StatusCode code;
    const char* says;
  } cases[] = {
      {R"({"max_tokens":1,"messages":[1]})", StatusCode::kMissingKey, "model is required"},
      {R"({"model":null,"max_tokens":1,"messages":[1]})", StatusCode::kWrongType, "model must be a string"},
      {R"({"model":7,"max_tokens":1,"messages":[1]})", StatusCode::kWrongType, "model must be a string"},
      {R"({"model":"","max_tokens":1,"messages":[1]})", StatusCode::kInvalidValue, "model must not be empty"},
      {R"({"model":"m","max_tokens":1})", StatusCode::kMissingKey, "messages is required"},
      {R"({"model":"m","max_tokens":1,"messages":"hi"})", StatusCode::kWrongType, "messages must be an array"},
      {R"({"model":"m","max_tokens":1,"messages":{}})", StatusCode::kWrongType, "messages must be an array"},
      {R"({"model":"m","max_tokens":1,"messages":null})", StatusCode::kWrongType, "messages must be an array"},
      {R"({"model":"m","max_tokens":1,"messages":[ ]})", StatusCode::kInvalidValue, "at least one message"},
      {R"({"model":"m","messages":[1]})", StatusCode::kMissingKey, "max_tokens is required"},
      {R"({"model":"m","max_tokens":null,"messages":[1]})", StatusCode::kWrongType, "max_tokens must be an integer"},
      {R"({"model":"m","max_tokens":"5","messages":[1]})", StatusCode::kWrongType, "max_tokens must be an integer"},
      {R"({"model":"m","max_tokens":5.0,"messages":[1]})", StatusCode::kWrongType, "max_tokens must be an integer"},
      {R"({"model":"m","max_tokens":0,"messages":[1]})", StatusCode::kInvalidValue, "max_tokens must be at least 1"},
      {R"({"model":"m","max_tokens":-2,"messages":[1]})", StatusCode::kInvalidValue, "at least 1, got -2"},
      {R"({"model":"m","max_tokens":18446744073709551615,"messages":[1]})", StatusCode::kOutOfRange, "max_tokens"},
      {R"({"model":"m","max_tokens":1,"messages":[1],"stream":"true"})", StatusCode::kWrongType,
       "stream must be a boolean"},
      {R"({"model":"m","max_tokens":1,"messages":[1],"stream":1})", StatusCode::kWrongType, "stream must be a boolean"},
  };
  for (const auto& c : cases) {
    const Status st = Check(c.body);
    EXPECT_EQ(st.code(), c.code) << c.body << ": " << st.to_string();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.body << ": " << st.message();
  }
}

TEST(AnthropicMessages, ErrorTypesFollowTheStatusAsAnthropicDocumentsThem) {
  EXPECT_EQ(anthropic_error_type(400), "invalid_request_error");
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(402), "billing_error");
  EXPECT_EQ(anthropic_error_type(403), "permission_error");
  EXPECT_EQ(anthropic_error_type(404), "not_found_error");
  EXPECT_EQ(anthropic_error_type(405), "invalid_request_error");
  EXPECT_EQ(anthropic_error_type(413), "request_too_large");
  EXPECT_EQ(anthropic_error_type(415), "invalid_request_error");
  EXPECT_EQ(anthropic_error_type(429), "rate_limit_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(anthropic_error_type(501), "api_error");
  EXPECT_EQ(anthropic_error_type(502), "api_error");
  EXPECT_EQ(anthropic_error_type(503), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(504), "timeout_error");
  EXPECT_EQ(anthropic_error_type(529), "overloaded_error");
}

TEST(AnthropicMessages, ErrorBodyAndEventAreAnthropicsShapeWithTheMessageEscaped) {
  const std::string message = "decode \"d1\" failed\nat\ttoken 3 \\ \x01";
  const json body = json::parse(anthropic_error_body(502, message));
  EXPECT_EQ(body, (json{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}}));
  const std::string event = anthropic_error_event(504, "late");
  ASSERT_EQ(event.rfind("event: error\ndata: ", 0), 0u) << event;
  ASSERT_TRUE(event.ends_with("\n\n")) << event;
  EXPECT_EQ(std::count(event.begin(), event.end(), '\n'), 3);  // one event: two lines, one blank
  const std::string data = event.substr(19, event.size() - 21);
  EXPECT_EQ(json::parse(data)["error"]["type"], "timeout_error");
  EXPECT_EQ(json::parse(data)["error"]["message"], "late");
}

TEST(AnthropicMessages, OnlyTheTwoMessagesPathsAreAnthropics) {
  EXPECT_TRUE(is_anthropic_path("/v1/messages"));
  EXPECT_TRUE(is_anthropic_path("/v1/messages/count_tokens"));
  for (const char* path : {"/v1/messages/", "/v1/message", "/v1/chat/completions", "/v1/messages/x", ""}) {
    EXPECT_FALSE(is_anthropic_path(path)) << path;
  }
}

// --- build_legs ------------------------------------------------------------------------------

LegInstance Node(Connector c, const char* host, uint16_t port) {
  LegInstance inst;
  inst.connector = c;
  inst.http_address = {host, port};
  inst.zmq_address = std::string(host) + ":" + std::to_string(port + 1000);
  if (c == Connector::kMooncake) {
    inst.mooncake_engine_id = "engine-1";
    inst.bootstrap_port = 8998;
  }
  if (c == Connector::kSglang) inst.bootstrap_port = 8998;
  return inst;
}

LegInstance Moriio(TransferMode mode, const char* host, uint16_t http) {
  LegInstance inst = Node(Connector::kMoriio, host, http);
  inst.transfer_mode = mode;
  inst.moriio_zmq = MoriioZmqAddress{host, static_cast<uint16_t>(http + 1), static_cast<uint16_t>(http + 2)};
  inst.zmq_address = inst.moriio_zmq->to_string();
  return inst;
}

Status Build(const LegInstance& p, const LegInstance& d, LegBuild* out, const char* body = kClient) {
  return build_legs({kMessagesPath, body, ""}, p, d, std::nullopt, std::nullopt, LegOptions(), Rng(), out);
}

TEST(MessagesLegs, NixlBuildsTheLegsOfChatOnTheMessagesPath) {
  LegBuild b;
  ASSERT_TRUE(Build(Node(Connector::kNixl, "127.0.21.1", 8100), Node(Connector::kNixl, "127.0.21.2", 8200), &b).is_ok());
  EXPECT_EQ(b.prefill.path, "/v1/messages");
  EXPECT_EQ(b.decode.path, "/v1/messages");
  const json client = json::parse(kClient);
  const json p = json::parse(b.prefill.body_text());
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["stream"], false);
  EXPECT_FALSE(p.contains("max_completion_tokens"));  // no field of this API: not added
  EXPECT_EQ(p["kv_transfer_params"]["do_remote_decode"], true);
  for (const char* key : {"model", "system", "messages", "temperature", "metadata"}) EXPECT_EQ(p[key], client[key]) << key;
  EXPECT_EQ(json::parse(b.decode.body_text()), client);
  // The decode takes the top-level kv_transfer_params of the prefill's message (vLLM#37535).
  ASSERT_TRUE(finish_decode_leg(b.plan, &b.decode,
                                R"({"id":"chatcmpl-1","type":"message","role":"assistant","content":[],)"
                                R"("kv_transfer_params":{"remote_block_ids":[4],"remote_engine_id":"e"}})")
                  .is_ok());
  const json d = json::parse(b.decode.body_text());
  EXPECT_EQ(d["kv_transfer_params"]["remote_block_ids"], json::array({4}));
  EXPECT_EQ(d["max_tokens"], 20);
  EXPECT_EQ(d["stream"], true);
  // A message without kv_transfer_params (vLLM leaves a null one out): the no-KV fallback.
  LegBuild again;
  ASSERT_TRUE(
      Build(Node(Connector::kNixl, "127.0.21.1", 8100), Node(Connector::kNixl, "127.0.21.2", 8200), &again).is_ok());
  EXPECT_EQ(finish_decode_leg(again.plan, &again.decode, R"({"id":"x","type":"message","content":[]})").code(),
            StatusCode::kMissingKey);
}

TEST(MessagesLegs, MoriioDecrementsTheDecodesMaxTokens) {
  for (TransferMode mode : {TransferMode::kRead, TransferMode::kWrite}) {
    LegBuild b;
    ASSERT_TRUE(Build(Moriio(mode, "127.0.21.1", 8100), Moriio(mode, "127.0.21.2", 8200), &b).is_ok());
    EXPECT_EQ(json::parse(b.prefill.body_text())["max_tokens"], 1);
    EXPECT_EQ(json::parse(b.decode.body_text())["max_tokens"], 19);
    EXPECT_EQ(b.decode.path, "/v1/messages");
  }
}

TEST(MessagesLegs, AMaxCompletionTokensIsDroppedSoEveryDialectCapsMaxTokens) {
  // Not a field of this API: vLLM ignores it, but MoRIIO would decrement it instead of max_tokens
  // (and a non-integer one is no reason to refuse the request).
  const char* body = R"({"model":"m","max_tokens":6,"max_completion_tokens":4,"messages":[1]})";
  for (TransferMode mode : {TransferMode::kRead, TransferMode::kWrite}) {
    LegBuild b;
    ASSERT_TRUE(Build(Moriio(mode, "127.0.21.1", 8100), Moriio(mode, "127.0.21.2", 8200), &b, body).is_ok());
    const json p = json::parse(b.prefill.body_text()), d = json::parse(b.decode.body_text());
    EXPECT_EQ(p["max_tokens"], 1);
    EXPECT_EQ(d["max_tokens"], 5);
    EXPECT_FALSE(p.contains("max_completion_tokens"));
    EXPECT_FALSE(d.contains("max_completion_tokens"));
  }
  LegBuild b;
  EXPECT_TRUE(Build(Node(Connector::kNixl, "127.0.21.1", 8100), Node(Connector::kNixl, "127.0.21.2", 8200), &b,
                    R"({"model":"m","max_tokens":6,"max_completion_tokens":"x","messages":[1]})")
                  .is_ok());
}

TEST(MessagesLegs, MooncakeAndP2pNcclServeIt) {
  LegBuild m;
  ASSERT_TRUE(
      Build(Node(Connector::kMooncake, "127.0.21.1", 8100), Node(Connector::kMooncake, "127.0.21.2", 8200), &m).is_ok());
  EXPECT_TRUE(m.plan.concurrent);
  EXPECT_EQ(json::parse(m.decode.body_text())["kv_transfer_params"]["do_remote_prefill"], true);
  LegBuild n;
  ASSERT_TRUE(
      Build(Node(Connector::kP2pNccl, "127.0.21.1", 8100), Node(Connector::kP2pNccl, "127.0.21.2", 8200), &n).is_ok());
  EXPECT_EQ(json::parse(n.prefill.body_text())["max_tokens"], 1);
  EXPECT_EQ(n.prefill.path, "/v1/messages");
}

TEST(MessagesLegs, SglangIsRefusedWithItsReason) {
  LegBuild b;
  const Status st =
      Build(Node(Connector::kSglang, "127.0.21.1", 8100), Node(Connector::kSglang, "127.0.21.2", 8200), &b);
  EXPECT_EQ(st.code(), StatusCode::kRejected);
  EXPECT_NE(st.message().find("bootstrap"), std::string::npos) << st.message();
}

TEST(MessagesLegs, EveryDialectEitherServesItOrSaysWhy) {
  for (const Dialect* d : all_dialects()) {
    SCOPED_TRACE(d->name);
    EXPECT_EQ(unsupported_endpoint(*d, kMessagesPath), d->messages_unsupported);
    EXPECT_EQ(d->messages_unsupported.empty(), d->connector != Connector::kSglang);
    EXPECT_EQ(unsupported_endpoint(*d, "/v1/chat/completions"), "");
    EXPECT_EQ(unsupported_endpoint(*d, kResponsesPath), "");
    EXPECT_EQ(unsupported_endpoint(*d, kGeneratePath), d->tokens_in_unsupported);
  }
}

TEST(MessagesLegs, ABadBodyIsTheClientsFault) {
  LegBuild b;
  const Status st = Build(Node(Connector::kNixl, "127.0.21.1", 8100), Node(Connector::kNixl, "127.0.21.2", 8200), &b,
                          R"({"model":"m","messages":[1]})");
  EXPECT_EQ(st.code(), StatusCode::kMissingKey);
  EXPECT_NE(st.message().find("max_tokens"), std::string::npos);
}

}  // namespace
}  // namespace pdr::proto
