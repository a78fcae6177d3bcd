#include "proto/request_legs.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
// GCC 12 with -fsanitize=address -O2 reports a false -Wmaybe-uninitialized inside std::regex's
// std::function members (cf. GCC bug 105562); the regexes are the point of these tests, so keep them.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace pdr::proto {
namespace {

// Addresses: IPv4 ones are in 127.0.0.0/8. fd00::1/fd00::2 are not ::1 because the IPv6 forms
// (brackets in URLs and bootstrap hosts) are what is checked; the legs are only built here,
// nothing connects to them.

using nlohmann::json;

// Deterministic randomness (splitmix64).
RandomSource Rng(uint64_t seed = 1) {
  return [state = seed]() mutable {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
}

struct Body {
  const char* name;
  const char* path;
  std::string text;
  bool stream;
};

std::vector<Body> Bodies() {
  return {
      {"completions", "/v1/completions",
       R"({"model":"m", "prompt":"Hello caf\u00e9 \ud83d\ude00","max_tokens":20,"min_tokens":2,)"
       R"( "temperature":0.50,"extra":{"x":[1, 2],"max_tokens":3},"kv_transfer_params":null})",
       false},
      {"completions-stream", "/v1/completions",
       "{\n  \"model\": \"m\",\n  \"prompt\": [\"a\", \"b\"],\n  \"max_tokens\": 20,\n  \"stream\": "
       "true,\n  \"stream_options\": {\"include_usage\": true}\n}",
       true},
      {"chat", "/v1/chat/completions",
       R"({"model":"m","messages":[{"role":"user","content":"hi \"there\""}],)"
       R"("max_completion_tokens":10,"min_completion_tokens":1,"seed":7})",
       false},
      {"chat-stream", "/v1/chat/completions",
       R"({"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"}],)"
       R"("max_tokens":8,"max_completion_tokens":10,"stream":true,)"
       R"("stream_options":{"include_usage":true,"continuous_usage_stats":false},"top_p":1e-1})",
       true},
  };
}

LegInstance Moriio(const char* host, uint16_t http, uint16_t hs, uint16_t notify, uint32_t dp,
                   uint32_t tp, TransferMode mode) {
  LegInstance inst;
  inst.connector = Connector::kMoriio;
  inst.transfer_mode = mode;
  inst.http_address = {host, http};
  inst.moriio_zmq = MoriioZmqAddress{host, hs, notify};
  inst.zmq_address = inst.moriio_zmq->to_string();
  inst.dp_size = dp;
  inst.tp_size = tp;
  return inst;
}

LegInstance Plain(Connector c, const char* host, uint16_t port, uint32_t dp = 1) {
  LegInstance inst;
  inst.connector = c;
  inst.http_address = {host, port};
  inst.dp_size = dp;
  return inst;
}

LegBuild Build(const Body& body, const LegInstance& p, const LegInstance& d,
               std::optional<uint32_t> pr = std::nullopt, std::optional<uint32_t> dr = std::nullopt,
               LegOptions options = LegOptions(), std::string_view auth = "Bearer client") {
  LegBuild out;
  const Status st = build_legs({body.path, body.text, auth}, p, d, pr, dr, options, Rng(), &out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

// Every top-level member of the client body whose key is not in `edited` must appear in `leg_body`
// with the same raw bytes.
void ExpectUntouched(const std::string& client, const std::string& leg_body,
                     const std::set<std::string>& edited) {
  JsonObjectBody in, out;
  ASSERT_TRUE(JsonObjectBody::parse(client, JsonLimits(), &in).is_ok());
  ASSERT_TRUE(JsonObjectBody::parse(leg_body, JsonLimits(), &out).is_ok()) << leg_body;
  const json j = json::parse(client);
  for (const auto& [key, _] : j.items()) {
    if (edited.count(key)) continue;
    EXPECT_EQ(out.get_raw(key), in.get_raw(key)) << "key " << key << " in " << leg_body;
  }
}

const std::set<std::string> kPrefillEdited = {"kv_transfer_params", "stream", "max_tokens",
                                              "max_completion_tokens", "stream_options",
                                              "min_tokens", "min_completion_tokens"};

void ExpectPrefillEdits(const json& client, const json& leg) {
  EXPECT_EQ(leg["stream"], false);
  EXPECT_EQ(leg["max_tokens"], 1);
  if (client.contains("max_completion_tokens")) {
    EXPECT_EQ(leg["max_completion_tokens"], 1);
  } else {
    EXPECT_FALSE(leg.contains("max_completion_tokens"));
  }
  EXPECT_FALSE(leg.contains("stream_options"));
  EXPECT_FALSE(leg.contains("min_tokens"));
  EXPECT_FALSE(leg.contains("min_completion_tokens"));
}

void ExpectCommonHeaders(const LegRequest& leg, const std::string& path, const std::string& id) {
  EXPECT_EQ(leg.path, path);
  ASSERT_NE(leg.header("content-type"), nullptr);
  EXPECT_EQ(*leg.header("Content-Type"), "application/json");
  ASSERT_NE(leg.header("X-Request-Id"), nullptr);
  EXPECT_EQ(*leg.header("X-Request-Id"), id);
  ASSERT_NE(leg.header("Authorization"), nullptr);
  EXPECT_EQ(*leg.header("Authorization"), "Bearer client");
}

const std::regex kUuidDashed("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
// moriio_common.py regexes (PROTOCOLS.md 1.4).
const std::regex kPrefillAddr("___prefill_addr_(.+?)___decode_addr_");
const std::regex kDecodeAddr("___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$");

void ExpectAddressedId(const std::string& id, const std::string& p_zmq, const std::string& d_zmq) {
  std::smatch m;
  ASSERT_TRUE(std::regex_search(id, m, kPrefillAddr)) << id;
  EXPECT_EQ(m[1], p_zmq);
  ASSERT_TRUE(std::regex_search(id, m, kDecodeAddr)) << id;
  EXPECT_EQ(m[1], d_zmq);
  // vLLM's internal forms still match (chat: chatcmpl-ID-8hex; completions adds -0 first).
  const std::string internal = "cmpl-" + id + "-0-1a2b3c4d";
  ASSERT_TRUE(std::regex_search(internal, m, kDecodeAddr));
  EXPECT_EQ(m[1], d_zmq);
  EXPECT_TRUE(std::regex_search(id, std::regex("_[0-9a-f]{32}$"))) << id;
}

// ---------------- uuid ----------------

TEST(Uuid4, VersionVariantAndForms) {
  auto rng = Rng(42);
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const Uuid4 u = make_uuid4(rng);
    EXPECT_TRUE(std::regex_match(u.dashed(), kUuidDashed)) << u.dashed();
    EXPECT_TRUE(std::regex_match(u.hex(), std::regex("^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$")));
    std::string undashed = u.dashed();
    std::erase(undashed, '-');
    EXPECT_EQ(undashed, u.hex());
    seen.insert(u.hex());
  }
  EXPECT_EQ(seen.size(), 200u);
  const Uuid4 ones = make_uuid4([] { return ~uint64_t{0}; });
  EXPECT_EQ(ones.dashed(), "ffffffff-ffff-4fff-bfff-ffffffffffff");
  const Uuid4 zeros = make_uuid4([] { return uint64_t{0}; });
  EXPECT_EQ(zeros.hex(), "00000000000040008000000000000000");
}

TEST(HttpOrigin, BracketsIpv6) {
  EXPECT_EQ(http_origin("127.0.10.1", 8998), "http://127.0.10.1:8998");
  EXPECT_EQ(http_origin("fd00::1", 8998), "http://[fd00::1]:8998");
}

// ---------------- NIXL ----------------

TEST(NixlLegs, PrefillAndDecodeForEveryBodyShape) {
  for (const Body& body : Bodies()) {
    SCOPED_TRACE(body.name);
    const LegBuild b =
        Build(body, Plain(Connector::kNixl, "127.0.10.1", 8100), Plain(Connector::kNixl, "127.0.10.2", 8200));
    EXPECT_FALSE(b.plan.concurrent);
    EXPECT_TRUE(b.plan.decode_needs_prefill_params);
    EXPECT_TRUE(std::regex_match(b.plan.request_id, kUuidDashed)) << b.plan.request_id;
    EXPECT_TRUE(b.plan.transfer_id.empty());
    ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
    ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);
    EXPECT_EQ(b.prefill.header("X-data-parallel-rank"), nullptr);
    EXPECT_EQ(b.decode.header("X-data-parallel-rank"), nullptr);

    const json client = json::parse(body.text);
    const json pre = json::parse(b.prefill.body_text());
    ExpectPrefillEdits(client, pre);
    EXPECT_EQ(pre["kv_transfer_params"],
              json::parse(R"({"do_remote_decode":true,"do_remote_prefill":false,)"
                          R"("remote_engine_id":null,"remote_block_ids":null,"remote_host":null,)"
                          R"("remote_port":null})"));
    ExpectUntouched(body.text, b.prefill.body_text(), kPrefillEdited);
    EXPECT_EQ(b.decode.body_text(), body.text) << "decode is the client body until finish_decode_leg";
  }
}

TEST(NixlLegs, FinishCopiesPrefillParamsVerbatim) {
  const Body body = Bodies()[1];
  LegBuild b =
      Build(body, Plain(Connector::kNixl, "127.0.10.1", 8100), Plain(Connector::kNixl, "127.0.10.2", 8200));
  const std::string params =
      R"({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1, 2], [3]],)"
      R"( "remote_engine_id": "e1", "remote_request_id": "cmpl-x-0-abcd1234", "remote_host": "127.0.10.1",)"
      R"( "remote_port": 5601, "tp_size": 2, "dcp_size": 1, "pp_size": 1, "transfer_mode": "pull",)"
      R"( "future_key": {"n": 1.50}})";
  const std::string response = R"({"id":"cmpl-x","object":"text_completion","choices":[{"text":"a"}],)"
                               R"("kv_transfer_params": )" + params + "}";
  ASSERT_TRUE(finish_decode_leg(b.plan, &b.decode, response).is_ok());
  JsonObjectBody decoded;
  ASSERT_TRUE(JsonObjectBody::parse(b.decode.body_text(), JsonLimits(), &decoded).is_ok());
  EXPECT_EQ(decoded.get_raw("kv_transfer_params"), params) << "byte-for-byte";
  const json d = json::parse(b.decode.body_text());
  EXPECT_EQ(d["stream"], true) << "decode keeps the client's stream flag";
  EXPECT_EQ(d["max_tokens"], 20) << "and its max_tokens";
  EXPECT_EQ(d["stream_options"]["include_usage"], true);
  ExpectUntouched(body.text, b.decode.body_text(), {"kv_transfer_params"});
}

// The decode connects to remote_host: an admitted prefill must not aim it at a third host. Names
// below end in .invalid (RFC 6761: never resolve) and nothing here connects anywhere.
TEST(NixlLegs, FinishRefusesARemoteHostThatIsNotThePrefill) {
  const Body body = Bodies()[0];
  auto answer = [](std::string_view host_json) {
    return std::string(R"({"id":"x","kv_transfer_params":{"remote_engine_id":"e1","remote_block_ids":[[1]],)"
                       R"("remote_port":5600,"remote_host":)") +
           std::string(host_json) + "}}";
  };
  auto finish = [&](const char* prefill, const char* decode, std::string_view host_json) {
    LegBuild b = Build(body, Plain(Connector::kNixl, prefill, 8100), Plain(Connector::kNixl, decode, 8200));
    const std::string before = b.decode.body_text();
    Status st = finish_decode_leg(b.plan, &b.decode, answer(host_json));
    if (!st.is_ok()) {
      EXPECT_EQ(b.decode.body_text(), before) << "a refusal leaves the decode leg unchanged";
    }
    return st;
  };
  // The prefill's own registered host: any case, one trailing dot.
  EXPECT_TRUE(finish("node-p.invalid", "node-d.invalid", R"("node-p.invalid")").is_ok());
  EXPECT_TRUE(finish("node-p.invalid", "node-d.invalid", R"("NODE-P.invalid.")").is_ok());
  EXPECT_TRUE(finish("fd00::1", "fd00::2", R"("fd00:0::1")").is_ok());
  // Absent or null: nothing to aim.
  EXPECT_TRUE(finish("node-p.invalid", "node-d.invalid", "null").is_ok());
  // A third host, by name or address, or escaped in the key: refused, the decode never sent.
  for (const char* host : {R"("victim.invalid")", R"("fd00::2")", R"("127.0.0.1")", R"("localhost")"}) {
    const Status st = finish("node-p.invalid", "node-d.invalid", host);
    EXPECT_EQ(st.code(), StatusCode::kRejected) << host;
    EXPECT_NE(st.message().find("not the prefill's own host 'node-p.invalid'"), std::string::npos) << st.message();
  }
  EXPECT_EQ(finish("node-p.invalid", "node-d.invalid", "5").code(), StatusCode::kWrongType);
  {
    LegBuild b = Build(body, Plain(Connector::kNixl, "node-p.invalid", 8100),
                       Plain(Connector::kNixl, "node-d.invalid", 8200));
    EXPECT_EQ(finish_decode_leg(b.plan, &b.decode,
                                R"({"kv_transfer_params":{"remote_block_ids":[[1]],"remote\u005fhost":"victim.invalid"}})")
                  .code(),
              StatusCode::kRejected);
  }
  // vLLM's default side channel host is "localhost": right when both nodes share a host (one
  // machine), wrong otherwise (the decode would connect to itself).
  EXPECT_TRUE(finish("node-p.invalid", "node-p.invalid", R"("localhost")").is_ok());
  EXPECT_TRUE(finish("127.0.10.1", "127.0.10.2", R"("localhost")").is_ok());
  EXPECT_TRUE(finish("127.0.10.1", "127.0.10.2", R"("127.0.10.9")").is_ok());
  EXPECT_EQ(finish("127.0.10.1", "node-d.invalid", R"("victim.invalid")").code(), StatusCode::kRejected);
}

TEST(NixlLegs, FinishReportsMissingOrNullParams) {
  const Body body = Bodies()[0];
  LegBuild b =
      Build(body, Plain(Connector::kNixl, "127.0.10.1", 8100), Plain(Connector::kNixl, "127.0.10.2", 8200));
  const std::string before = b.decode.body_text();
  EXPECT_EQ(finish_decode_leg(b.plan, &b.decode, R"({"id":"x","kv_transfer_params":null})").code(),
            StatusCode::kMissingKey);
  EXPECT_EQ(finish_decode_leg(b.plan, &b.decode, R"({"id":"x"})").code(), StatusCode::kMissingKey);
  EXPECT_EQ(finish_decode_leg(b.plan, &b.decode, R"({"kv_transfer_params":{}})").code(),
            StatusCode::kMissingKey);
  EXPECT_EQ(finish_decode_leg(b.plan, &b.decode, R"({"kv_transfer_params":[1]})").code(),
            StatusCode::kWrongType);
  EXPECT_EQ(finish_decode_leg(b.plan, &b.decode, R"({"kv_transfer_params":)").code(),
            StatusCode::kMalformed);
  EXPECT_EQ(b.decode.body_text(), before) << "errors leave the decode leg unchanged";
}

// ---------------- MoRIIO ----------------

struct MoriioCase {
  TransferMode mode;
  uint32_t p_dp;
  std::optional<uint32_t> p_rank;
  uint32_t d_dp;
  std::optional<uint32_t> d_rank;
};

TEST(MoriioLegs, ReadAndWriteForEveryBodyShape) {
  const std::vector<MoriioCase> cases = {
      {TransferMode::kRead, 2, 1, 1, std::nullopt},
      {TransferMode::kWrite, 2, 0, 4, 3},
      {TransferMode::kRead, 1, std::nullopt, 2, 1},
      {TransferMode::kWrite, 1, 0, 1, 0},
  };
  for (const MoriioCase& c : cases) {
    for (const Body& body : Bodies()) {
      SCOPED_TRACE(std::string(body.name) + " mode " + std::string(to_string(c.mode)) + " p_dp " +
                   std::to_string(c.p_dp) + " d_dp " + std::to_string(c.d_dp));
      const LegInstance p = Moriio("127.0.10.1", 8100, 6301, 61005, c.p_dp, 4, c.mode);
      const LegInstance d = Moriio("fd00::2", 8200, 6401, 61105, c.d_dp, 2, c.mode);
      const LegBuild b = Build(body, p, d, c.p_rank, c.d_rank);
      EXPECT_EQ(b.plan.concurrent, c.mode == TransferMode::kWrite);
      EXPECT_EQ(b.plan.decode_needs_prefill_params, c.mode == TransferMode::kRead);
      ExpectAddressedId(b.plan.request_id, "host:127.0.10.1,handshake:6301,notify:61005",
                        "host:fd00::2,handshake:6401,notify:61105");
      EXPECT_TRUE(std::regex_match(b.plan.transfer_id,
                                   std::regex("^tx-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")))
          << b.plan.transfer_id;
      ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
      ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);
      // DP headers: prefill only when P.dp > 1; decode only with a rank valid for D and D.dp > 1.
      if (c.p_dp > 1) {
        ASSERT_NE(b.prefill.header("X-data-parallel-rank"), nullptr);
        EXPECT_EQ(*b.prefill.header("X-data-parallel-rank"), std::to_string(*c.p_rank));
      } else {
        EXPECT_EQ(b.prefill.header("X-data-parallel-rank"), nullptr);
      }
      if (c.d_dp > 1 && c.d_rank) {
        ASSERT_NE(b.decode.header("X-data-parallel-rank"), nullptr);
        EXPECT_EQ(*b.decode.header("X-data-parallel-rank"), std::to_string(*c.d_rank));
      } else {
        EXPECT_EQ(b.decode.header("X-data-parallel-rank"), nullptr);
      }

      const json client = json::parse(body.text);
      const json pre = json::parse(b.prefill.body_text());
      ExpectPrefillEdits(client, pre);
      json want_p = {{"remote_dp_size", c.d_dp},     {"remote_tp_size", 2},
                     {"transfer_id", b.plan.transfer_id}, {"do_remote_decode", true},
                     {"do_remote_prefill", false},   {"remote_engine_id", nullptr},
                     {"remote_block_ids", nullptr},  {"remote_host", "fd00::2"},
                     {"remote_handshake_port", 6401}, {"remote_notify_port", 61105}};
      EXPECT_EQ(pre["kv_transfer_params"], want_p);
      ExpectUntouched(body.text, b.prefill.body_text(), kPrefillEdited);

      const json dec = json::parse(b.decode.body_text());
      json want_d = {{"do_remote_decode", false},   {"do_remote_prefill", true},
                     {"remote_engine_id", nullptr}, {"remote_block_ids", nullptr},
                     {"transfer_id", b.plan.transfer_id}, {"remote_dp_size", c.p_dp},
                     {"remote_tp_size", 4},         {"remote_host", "127.0.10.1"},
                     {"remote_handshake_port", 6301}, {"remote_notify_port", 61005}};
      if (c.p_dp > 1) want_d["remote_dp_rank"] = *c.p_rank;
      EXPECT_EQ(dec["kv_transfer_params"], want_d);
      // max_completion_tokens -= 1 if present, else max_tokens -= 1.
      if (client.contains("max_completion_tokens")) {
        EXPECT_EQ(dec["max_completion_tokens"], client["max_completion_tokens"].get<int>() - 1);
        if (client.contains("max_tokens")) {
          EXPECT_EQ(dec["max_tokens"], client["max_tokens"]);
        }
      } else {
        EXPECT_EQ(dec["max_tokens"], client["max_tokens"].get<int>() - 1);
      }
      EXPECT_EQ(dec.value("stream", false), body.stream);
      EXPECT_EQ(dec.contains("stream_options"), client.contains("stream_options"));
      ExpectUntouched(body.text, b.decode.body_text(),
                      {"kv_transfer_params", "max_tokens", "max_completion_tokens"});
    }
  }
}

TEST(MoriioLegs, RemoteAddressesAreOptional) {
  LegOptions options;
  options.moriio_send_remote_addresses = false;
  const LegBuild b = Build(Bodies()[0], Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kRead),
                           Moriio("127.0.10.2", 8200, 6401, 61105, 1, 1, TransferMode::kRead),
                           std::nullopt, std::nullopt, options);
  for (const std::string& s : {b.prefill.body_text(), b.decode.body_text()}) {
    const json kv = json::parse(s)["kv_transfer_params"];
    EXPECT_FALSE(kv.contains("remote_host"));
    EXPECT_FALSE(kv.contains("remote_handshake_port"));
    EXPECT_FALSE(kv.contains("remote_notify_port"));
  }
}

TEST(MoriioLegs, ZmqAddressParsedWhenNotGivenParsed) {
  LegInstance p = Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kWrite);
  LegInstance d = Moriio("127.0.10.2", 8200, 6401, 61105, 1, 1, TransferMode::kWrite);
  p.moriio_zmq.reset();
  const LegBuild b = Build(Bodies()[0], p, d);
  EXPECT_EQ(json::parse(b.decode.body_text())["kv_transfer_params"]["remote_notify_port"], 61005);
  p.zmq_address = "127.0.10.1:5000";  // not a MoRIIO address
  LegBuild out;
  EXPECT_EQ(build_legs({"/v1/completions", Bodies()[0].text, ""}, p, d, std::nullopt,
                       std::nullopt, LegOptions(), Rng(), &out)
                .code(),
            StatusCode::kRejected);
}

TEST(MoriioLegs, DecodeTokenDecrementNeverBelowOne) {
  const LegInstance p = Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kWrite);
  const LegInstance d = Moriio("127.0.10.2", 8200, 6401, 61105, 1, 1, TransferMode::kWrite);
  struct Case {
    std::string body;
    const char* key;
    json want;
  };
  const std::vector<Case> cases = {
      {R"({"prompt":"x","max_tokens":1})", "max_tokens", 1},
      {R"({"prompt":"x","max_tokens":2})", "max_tokens", 1},
      {R"({"prompt":"x","max_tokens":null})", "max_tokens", nullptr},
      {R"({"prompt":"x","max_completion_tokens":null,"max_tokens":5})", "max_tokens", 4},
      {R"({"prompt":"x","max_completion_tokens":1,"max_tokens":5})", "max_tokens", 5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const LegBuild b = Build({"x", "/v1/completions", c.body, false}, p, d);
    EXPECT_EQ(json::parse(b.decode.body_text())[c.key], c.want);
    EXPECT_EQ(json::parse(b.prefill.body_text())["max_tokens"], 1);
  }
  const LegBuild none = Build({"x", "/v1/completions", R"({"prompt":"x"})", false}, p, d);
  EXPECT_FALSE(json::parse(none.decode.body_text()).contains("max_tokens"));
  EXPECT_EQ(json::parse(none.prefill.body_text())["max_tokens"], 1);
}

TEST(MoriioLegs, FinishReadCopiesFourFields) {
  const Body body = Bodies()[3];
  LegBuild b = Build(body, Moriio("127.0.10.1", 8100, 6301, 61005, 2, 4, TransferMode::kRead),
                     Moriio("127.0.10.2", 8200, 6401, 61105, 1, 2, TransferMode::kRead), 1);
  const std::string response =
      R"({"id":"chatcmpl-x","kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,)"
      R"("remote_block_ids":[4, 5,6],"remote_engine_id":"127.0.10.1:6301","remote_host":"127.0.10.9",)"
      R"("remote_handshake_port":1,"remote_notify_port":2,"remote_dp_size":2,"tp_size":4,)"
      R"("transfer_id":")" + b.plan.transfer_id + R"("}})";
  ASSERT_TRUE(finish_decode_leg(b.plan, &b.decode, response).is_ok());
  const json kv = json::parse(b.decode.body_text())["kv_transfer_params"];
  EXPECT_EQ(kv["remote_block_ids"], json::parse("[4,5,6]"));
  EXPECT_EQ(kv["remote_engine_id"], "127.0.10.1:6301");
  EXPECT_EQ(kv["transfer_id"], b.plan.transfer_id);
  EXPECT_EQ(kv["tp_size"], 4);
  EXPECT_EQ(kv["do_remote_prefill"], true);
  EXPECT_EQ(kv["remote_dp_rank"], 1);
  EXPECT_EQ(kv["remote_host"], "127.0.10.1") << "our own peer address is kept, not the response's";
  EXPECT_EQ(kv["remote_dp_size"], 2);
  ExpectUntouched(body.text, b.decode.body_text(),
                  {"kv_transfer_params", "max_tokens", "max_completion_tokens"});

  LegBuild b2 = Build(body, Moriio("127.0.10.1", 8100, 6301, 61005, 1, 4, TransferMode::kRead),
                      Moriio("127.0.10.2", 8200, 6401, 61105, 1, 2, TransferMode::kRead));
  const std::string before = b2.decode.body_text();
  EXPECT_EQ(finish_decode_leg(b2.plan, &b2.decode, R"({"kv_transfer_params":null})").code(),
            StatusCode::kMissingKey);
  EXPECT_EQ(finish_decode_leg(b2.plan, &b2.decode,
                              R"({"kv_transfer_params":{"remote_engine_id":"e"}})")
                .code(),
            StatusCode::kMissingKey);
  EXPECT_EQ(b2.decode.body_text(), before);
}

TEST(MoriioLegs, FinishIsNoOpForWrite) {
  LegBuild b = Build(Bodies()[0], Moriio("127.0.10.1", 8100, 6301, 61005, 1, 4, TransferMode::kWrite),
                     Moriio("127.0.10.2", 8200, 6401, 61105, 1, 2, TransferMode::kWrite));
  const std::string before = b.decode.body_text();
  EXPECT_TRUE(finish_decode_leg(b.plan, &b.decode, "not json").is_ok());
  EXPECT_EQ(b.decode.body_text(), before);
}

TEST(MoriioLegs, RejectsBadPairs) {
  LegBuild out;
  const std::string text = Bodies()[0].text;
  const ClientRequest req{"/v1/completions", text, ""};
  const LegInstance r = Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kRead);
  const LegInstance w = Moriio("127.0.10.2", 8200, 6401, 61105, 1, 1, TransferMode::kWrite);
  EXPECT_EQ(build_legs(req, r, w, std::nullopt, std::nullopt, {}, Rng(), &out).code(),
            StatusCode::kRejected);
  LegInstance none = r;
  none.transfer_mode = TransferMode::kNone;
  EXPECT_EQ(build_legs(req, none, none, std::nullopt, std::nullopt, {}, Rng(), &out).code(),
            StatusCode::kRejected);
  const LegInstance p2 = Moriio("127.0.10.1", 8100, 6301, 61005, 2, 1, TransferMode::kRead);
  EXPECT_EQ(build_legs(req, p2, r, std::nullopt, std::nullopt, {}, Rng(), &out).code(),
            StatusCode::kRejected)
      << "dp_size > 1 needs a rank";
  EXPECT_EQ(build_legs(req, p2, r, 2, std::nullopt, {}, Rng(), &out).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(build_legs(req, r, r, std::nullopt, 1, {}, Rng(), &out).code(), StatusCode::kOutOfRange)
      << "decode rank must be valid for the decode's dp_size";
  EXPECT_EQ(build_legs(req, r, Plain(Connector::kNixl, "h", 1), std::nullopt, std::nullopt, {},
                       Rng(), &out)
                .code(),
            StatusCode::kRejected);
}

// ---------------- Mooncake ----------------

TEST(MooncakeLegs, ConcurrentWithBootstrapAddr) {
  for (const Body& body : Bodies()) {
    for (const char* host : {"127.0.10.1", "fd00::1"}) {
      SCOPED_TRACE(std::string(body.name) + " " + host);
      LegInstance p = Plain(Connector::kMooncake, host, 8100, 2);
      p.mooncake_engine_id = "engine-dp1";
      const LegInstance d = Plain(Connector::kMooncake, "127.0.10.2", 8200);
      const LegBuild b = Build(body, p, d, 1, 0);
      EXPECT_TRUE(b.plan.concurrent);
      EXPECT_FALSE(b.plan.decode_needs_prefill_params);
      EXPECT_TRUE(std::regex_match(b.plan.request_id, kUuidDashed));
      EXPECT_EQ(b.plan.transfer_id, "xfer-" + b.plan.request_id);
      ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
      ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);
      ASSERT_NE(b.prefill.header("X-data-parallel-rank"), nullptr);
      EXPECT_EQ(*b.prefill.header("X-data-parallel-rank"), "1");
      EXPECT_EQ(b.decode.header("X-data-parallel-rank"), nullptr);

      const json client = json::parse(body.text);
      const json pre = json::parse(b.prefill.body_text());
      ExpectPrefillEdits(client, pre);
      EXPECT_EQ(pre["kv_transfer_params"],
                (json{{"do_remote_decode", true},
                      {"do_remote_prefill", false},
                      {"transfer_id", b.plan.transfer_id}}));
      ExpectUntouched(body.text, b.prefill.body_text(), kPrefillEdited);
      const json dec = json::parse(b.decode.body_text());
      const std::string addr = std::string("http://") +
                               (std::string(host) == "fd00::1" ? "[fd00::1]" : host) + ":8998";
      EXPECT_EQ(dec["kv_transfer_params"],
                (json{{"do_remote_decode", false},
                      {"do_remote_prefill", true},
                      {"remote_bootstrap_addr", addr},
                      {"remote_engine_id", "engine-dp1"},
                      {"transfer_id", b.plan.transfer_id}}));
      ExpectUntouched(body.text, b.decode.body_text(), {"kv_transfer_params"});
    }
  }
}

TEST(MooncakeLegs, NeedsEngineId) {
  LegBuild out;
  const std::string text = Bodies()[0].text;
  const LegInstance p = Plain(Connector::kMooncake, "127.0.10.1", 8100);
  EXPECT_EQ(build_legs({"/v1/completions", text, ""}, p, p, std::nullopt, std::nullopt, {}, Rng(),
                       &out)
                .code(),
            StatusCode::kRejected);
  LegInstance q = p;
  q.mooncake_engine_id = "e";
  q.bootstrap_port = 9000;
  ASSERT_TRUE(build_legs({"/v1/completions", text, ""}, q, p, std::nullopt, std::nullopt, {},
                         Rng(), &out)
                  .is_ok());
  EXPECT_EQ(json::parse(out.decode.body_text())["kv_transfer_params"]["remote_bootstrap_addr"],
            "http://127.0.10.1:9000");
}

// ---------------- NIXL push ----------------

LegInstance PushPrefill(uint32_t dp = 1) {
  LegInstance p = Plain(Connector::kNixlPush, "127.0.10.1", 8100, dp);
  p.engine_id = "prefill-engine-001";
  p.zmq_address = "127.0.10.11:5600";
  fill_parsed_zmq_address(&p);
  p.tp_size = 2;
  p.pp_size = 3;
  return p;
}

TEST(NixlPushLegs, ConcurrentWithThePrefillsCoordinates) {
  for (const Body& body : Bodies()) {
    SCOPED_TRACE(body.name);
    const LegInstance d = Plain(Connector::kNixlPush, "127.0.10.2", 8200);
    const LegBuild b = Build(body, PushPrefill(), d, std::nullopt, std::nullopt);
    EXPECT_TRUE(b.plan.concurrent);
    EXPECT_FALSE(b.plan.decode_needs_prefill_params);
    EXPECT_TRUE(std::regex_match(b.plan.request_id, kUuidDashed));
    ASSERT_EQ(b.plan.transfer_id.rfind("xfer-", 0), 0u) << b.plan.transfer_id;
    EXPECT_TRUE(std::regex_match(b.plan.transfer_id.substr(5), kUuidDashed));
    EXPECT_NE(b.plan.transfer_id, "xfer-" + b.plan.request_id) << "a uuid of its own";
    ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
    ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);
    EXPECT_EQ(b.prefill.header("X-data-parallel-rank"), nullptr);

    const json client = json::parse(body.text);
    const json pre = json::parse(b.prefill.body_text());
    ExpectPrefillEdits(client, pre);
    EXPECT_EQ(pre["kv_transfer_params"], (json{{"do_remote_decode", true},
                                               {"do_remote_prefill", false},
                                               {"remote_engine_id", nullptr},
                                               {"remote_block_ids", nullptr},
                                               {"remote_host", nullptr},
                                               {"remote_port", nullptr},
                                               {"transfer_id", b.plan.transfer_id}}));
    ExpectUntouched(body.text, b.prefill.body_text(), kPrefillEdited);
    const json dec = json::parse(b.decode.body_text());
    EXPECT_EQ(dec["kv_transfer_params"], (json{{"do_remote_decode", false},
                                              {"do_remote_prefill", true},
                                              {"remote_engine_id", "prefill-engine-001"},
                                              {"remote_host", "127.0.10.11"},
                                              {"remote_port", 5600},
                                              {"tp_size", 2},
                                              {"pp_size", 3},
                                              {"remote_request_id", b.plan.request_id},
                                              {"transfer_id", b.plan.transfer_id}}));
    ExpectUntouched(body.text, b.decode.body_text(), {"kv_transfer_params"});
  }
}

TEST(NixlPushLegs, DataParallelRankNamesItsEngineAndPort) {
  const LegInstance d = Plain(Connector::kNixlPush, "127.0.10.2", 8200);
  const LegBuild b = Build(Bodies()[0], PushPrefill(4), d, 3, std::nullopt);
  ASSERT_NE(b.prefill.header("X-data-parallel-rank"), nullptr);
  EXPECT_EQ(*b.prefill.header("X-data-parallel-rank"), "3");
  const json k = json::parse(b.decode.body_text())["kv_transfer_params"];
  EXPECT_EQ(k["remote_engine_id"], "prefill-engine-001_dp3");
  EXPECT_EQ(k["remote_port"], 5603);
}

TEST(NixlPushLegs, EveryBuildHasAFreshTransferId) {
  const LegInstance d = Plain(Connector::kNixlPush, "127.0.10.2", 8200);
  uint64_t n = 0;
  auto rng = [&n] { return ++n * 0x9e3779b97f4a7c15ull; };
  std::set<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    LegBuild b;
    ASSERT_TRUE(build_legs({"/v1/completions", Bodies()[0].text, ""}, PushPrefill(), d, std::nullopt, std::nullopt,
                           {}, rng, &b)
                    .is_ok());
    EXPECT_TRUE(ids.insert(b.plan.transfer_id).second) << b.plan.transfer_id;
  }
}

TEST(NixlPushLegs, RejectsAPrefillItCannotName) {
  const std::string text = Bodies()[0].text;
  const LegInstance d = Plain(Connector::kNixlPush, "127.0.10.2", 8200);
  LegBuild out;
  LegInstance no_engine = PushPrefill();
  no_engine.engine_id.clear();
  EXPECT_EQ(build_legs({"/v1/completions", text, ""}, no_engine, d, std::nullopt, std::nullopt, {}, Rng(), &out).code(),
            StatusCode::kRejected);
  LegInstance no_channel = PushPrefill();
  no_channel.kv_address.reset();
  EXPECT_EQ(
      build_legs({"/v1/completions", text, ""}, no_channel, d, std::nullopt, std::nullopt, {}, Rng(), &out).code(),
      StatusCode::kRejected);
  EXPECT_EQ(build_legs({"/v1/completions", text, ""}, PushPrefill(2), d, std::nullopt, std::nullopt, {}, Rng(), &out)
                .code(),
            StatusCode::kRejected)
      << "dp_size > 1 needs a rank";
  LegInstance high = PushPrefill(4);
  high.kv_address->port = 65534;
  EXPECT_EQ(build_legs({"/v1/completions", text, ""}, high, d, 3, std::nullopt, {}, Rng(), &out).code(),
            StatusCode::kRejected)
      << "port + rank past 65535";
  EXPECT_EQ(build_legs({"/v1/completions", text, ""}, PushPrefill(), Plain(Connector::kNixl, "h", 1), std::nullopt,
                       std::nullopt, {}, Rng(), &out)
                .code(),
            StatusCode::kRejected)
      << "push never pairs with pull";
}

// ---------------- P2P-NCCL ----------------

TEST(P2pNcclLegs, SerialNoKvParamsDecodeUnchanged) {
  for (const Body& body : Bodies()) {
    SCOPED_TRACE(body.name);
    LegInstance p = Plain(Connector::kP2pNccl, "127.0.10.1", 8100);
    p.zmq_address = "127.0.10.1:21001";
    LegInstance d = Plain(Connector::kP2pNccl, "127.0.10.2", 8200);
    d.zmq_address = "127.0.10.2:22001";
    const LegBuild b = Build(body, p, d);
    EXPECT_FALSE(b.plan.concurrent);
    EXPECT_FALSE(b.plan.decode_needs_prefill_params);
    ExpectAddressedId(b.plan.request_id, "127.0.10.1:21001", "127.0.10.2:22001");
    // The P2P connector's own parse: ___decode_addr_(.*):(\d+) and ___prefill_addr_(.*):(\d+)___
    std::smatch m;
    ASSERT_TRUE(std::regex_search(b.plan.request_id, m, std::regex("___decode_addr_(.*):(\\d+)")));
    EXPECT_EQ(m[1], "127.0.10.2");
    EXPECT_EQ(m[2], "22001");
    ASSERT_TRUE(
        std::regex_search(b.plan.request_id, m, std::regex("___prefill_addr_(.*):(\\d+)___")));
    EXPECT_EQ(m[1], "127.0.10.1");
    EXPECT_EQ(m[2], "21001");
    ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
    ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);

    const json client = json::parse(body.text);
    const json pre = json::parse(b.prefill.body_text());
    EXPECT_EQ(pre["max_tokens"], 1);
    EXPECT_EQ(pre.contains("max_completion_tokens"), client.contains("max_completion_tokens"));
    if (client.contains("max_completion_tokens")) {
      EXPECT_EQ(pre["max_completion_tokens"], 1);
    }
    EXPECT_EQ(pre.value("stream", false), body.stream) << "stream is not changed";
    EXPECT_EQ(pre.contains("stream_options"), client.contains("stream_options"));
    // A client's own kv_transfer_params reaches neither node (security review #22).
    EXPECT_FALSE(pre.contains("kv_transfer_params"));
    EXPECT_FALSE(pre.contains("min_tokens"));  // vLLM: min_tokens > max_tokens is a 400
    EXPECT_FALSE(pre.contains("min_completion_tokens"));
    ExpectUntouched(body.text, b.prefill.body_text(),
                    {"max_tokens", "max_completion_tokens", "min_tokens", "min_completion_tokens",
                     "kv_transfer_params"});
    if (client.contains("kv_transfer_params")) {
      EXPECT_FALSE(json::parse(b.decode.body_text()).contains("kv_transfer_params"));
      ExpectUntouched(body.text, b.decode.body_text(), {"kv_transfer_params"});
    } else {
      EXPECT_EQ(b.decode.body_text(), body.text);
    }
  }
}

TEST(P2pNcclLegs, ClientKvTransferParamsAreRemovedFromBothLegs) {
  LegInstance p = Plain(Connector::kP2pNccl, "127.0.10.1", 8100);
  p.zmq_address = "127.0.10.1:21001";
  LegInstance d = Plain(Connector::kP2pNccl, "127.0.10.2", 8200);
  d.zmq_address = "127.0.10.2:22001";
  const Body body{"object", "/v1/completions",
                  R"({"model":"m","prompt":"x","max_tokens":5,"kv_transfer_params":{"remote_host":"127.9.9.9"}})",
                  false};
  const LegBuild b = Build(body, p, d);
  EXPECT_EQ(b.prefill.body_text().find("127.9.9.9"), std::string::npos) << b.prefill.body_text();
  EXPECT_EQ(b.decode.body_text().find("127.9.9.9"), std::string::npos) << b.decode.body_text();
  EXPECT_EQ(json::parse(b.decode.body_text())["max_tokens"], 5);
}

// ---------------- SGLang ----------------

TEST(SglangLegs, SameBodyWithBootstrapFields) {
  for (const Body& body : Bodies()) {
    for (const char* host : {"127.0.10.1", "fd00::1"}) {
      SCOPED_TRACE(std::string(body.name) + " " + host);
      LegInstance p = Plain(Connector::kSglang, host, 30000);
      p.bootstrap_port = 8998;
      const LegInstance d = Plain(Connector::kSglang, "127.0.10.2", 30001);
      const LegBuild b = Build(body, p, d);
      EXPECT_TRUE(b.plan.concurrent);
      EXPECT_FALSE(b.plan.decode_needs_prefill_params);
      ASSERT_TRUE(b.plan.bootstrap_room);
      EXPECT_LE(*b.plan.bootstrap_room, uint64_t{0x7FFFFFFFFFFFFFFF});
      EXPECT_EQ(b.prefill.body_text(), b.decode.body_text());
      ExpectCommonHeaders(b.prefill, body.path, b.plan.request_id);
      ExpectCommonHeaders(b.decode, body.path, b.plan.request_id);
      const json j = json::parse(b.prefill.body_text());
      EXPECT_EQ(j["bootstrap_host"], std::string(host) == "fd00::1" ? "[fd00::1]" : host);
      EXPECT_EQ(j["bootstrap_port"], 8998);
      EXPECT_EQ(j["bootstrap_room"].get<uint64_t>(), *b.plan.bootstrap_room);
      ExpectUntouched(body.text, b.prefill.body_text(),
                      {"bootstrap_host", "bootstrap_port", "bootstrap_room"});
    }
  }
  LegInstance p = Plain(Connector::kSglang, "127.0.10.1", 30000);
  const LegBuild b = Build(Bodies()[0], p, p);
  EXPECT_TRUE(json::parse(b.prefill.body_text())["bootstrap_port"].is_null());
  // The room uses all 63 bits.
  LegBuild big;
  ASSERT_TRUE(build_legs({"/v1/completions", "{}", ""}, p, p, std::nullopt, std::nullopt, {},
                         [] { return ~uint64_t{0}; }, &big)
                  .is_ok());
  EXPECT_EQ(json::parse(big.prefill.body_text())["bootstrap_room"].get<uint64_t>(), 0x7FFFFFFFFFFFFFFFull);
}

// ---------------- shared behaviour ----------------

TEST(LegHeaders, AuthorizationPolicy) {
  const LegInstance p = Plain(Connector::kNixl, "127.0.10.1", 8100);
  LegBuild out;
  const std::string text = "{}";
  ASSERT_TRUE(build_legs({"/v1/completions", text, ""}, p, p, std::nullopt, std::nullopt, {},
                         Rng(), &out)
                  .is_ok());
  EXPECT_EQ(out.prefill.header("Authorization"), nullptr);
  EXPECT_EQ(out.decode.header("Authorization"), nullptr);
  LegOptions key;
  key.upstream_api_key = "sk-up";
  ASSERT_TRUE(build_legs({"/v1/completions", text, "Bearer client"}, p, p, std::nullopt,
                         std::nullopt, key, Rng(), &out)
                  .is_ok());
  EXPECT_EQ(*out.prefill.header("Authorization"), "Bearer sk-up");
  EXPECT_EQ(*out.decode.header("Authorization"), "Bearer sk-up");
  LegOptions no_forward;
  no_forward.forward_client_authorization = false;
  ASSERT_TRUE(build_legs({"/v1/completions", text, "Bearer client"}, p, p, std::nullopt,
                         std::nullopt, no_forward, Rng(), &out)
                  .is_ok());
  EXPECT_EQ(out.prefill.header("Authorization"), nullptr);
}

TEST(LegErrors, ClientBodyProblemsArePrecise) {
  const LegInstance p = Plain(Connector::kNixl, "127.0.10.1", 8100);
  LegBuild out;
  auto build = [&](std::string_view body) {
    return build_legs({"/v1/completions", body, ""}, p, p, std::nullopt, std::nullopt, {}, Rng(),
                      &out);
  };
  Status st = build(R"({"prompt": "x",})");
  EXPECT_EQ(st.code(), StatusCode::kMalformed);
  EXPECT_NE(st.message().find("at byte 15"), std::string::npos) << st.message();
  st = build("[1]");
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  EXPECT_EQ(st.message(), "JSON body must be an object, got an array");
  st = build(R"({"max_tokens": "10"})");
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  EXPECT_EQ(st.message(), "max_tokens must be an integer, got a string");
  st = build(R"({"max_tokens": 10.5})");
  EXPECT_EQ(st.message(), "max_tokens must be an integer, got 10.5");
  st = build(R"({"max_completion_tokens": true})");
  EXPECT_EQ(st.code(), StatusCode::kWrongType);
  st = build(R"({"max_tokens": 1, "max_tokens": 2})");
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue);
  EXPECT_TRUE(build(R"({"max_tokens": null})").is_ok());
  st = build_legs({"/v1/embeddings", "{}", ""}, p, p, std::nullopt, std::nullopt, {}, Rng(), &out);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  LegInstance unknown;
  st = build_legs({"/v1/completions", "{}", ""}, unknown, unknown, std::nullopt, std::nullopt, {},
                  Rng(), &out);
  EXPECT_EQ(st.code(), StatusCode::kRejected);
}

TEST(LegBodies, ClientKvTransferParamsAreReplaced) {
  const std::string body = R"({"prompt":"x","kv_transfer_params":{"do_remote_decode":false,"evil":1}})";
  const LegBuild b = Build({"x", "/v1/completions", body, false},
                           Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kWrite),
                           Moriio("127.0.10.2", 8200, 6401, 61105, 1, 1, TransferMode::kWrite));
  EXPECT_FALSE(json::parse(b.prefill.body_text())["kv_transfer_params"].contains("evil"));
  EXPECT_FALSE(json::parse(b.decode.body_text())["kv_transfer_params"].contains("evil"));
}

TEST(LegBodies, DeterministicGivenTheSameRandomness) {
  const LegInstance p = Moriio("127.0.10.1", 8100, 6301, 61005, 1, 1, TransferMode::kWrite);
  const LegBuild a = Build(Bodies()[0], p, p);
  const LegBuild b = Build(Bodies()[0], p, p);
  EXPECT_EQ(a.plan.request_id, b.plan.request_id);
  EXPECT_EQ(a.prefill.body_text(), b.prefill.body_text());
  EXPECT_NE(a.plan.request_id.substr(a.plan.request_id.size() - 32),
            a.plan.transfer_id.substr(3, 8)) << "two independent uuids";
}

}  // namespace
}  // namespace pdr::proto

namespace pdr::proto {
namespace {

// Parse once (#12): with the client body parsed by the caller, building the legs (and
// rebuilding them for a retry) parses nothing; completing a decode parses only the prefill's
// answer (and its kv_transfer_params); legs share the client's bytes and render identically.
TEST(ParseOnce, LegsAreBuiltFromTheCallersParse) {
  const std::vector<Body> bodies = Bodies();
  const Body& body = bodies[0];
  JsonObjectBody client;
  const uint64_t before_client = json_object_parses();
  ASSERT_TRUE(JsonObjectBody::parse(body.text, JsonLimits(), &client).is_ok());
  EXPECT_EQ(json_object_parses() - before_client, 1u);

  const LegInstance p = Plain(Connector::kNixl, "127.0.10.1", 8100);
  const LegInstance d = Plain(Connector::kNixl, "127.0.10.2", 8200);
  const uint64_t before = json_object_parses();
  LegBuild built, again;
  ASSERT_TRUE(build_legs({body.path, body.text, "", &client}, p, d, std::nullopt, std::nullopt, LegOptions(), Rng(),
                         &built)
                  .is_ok());
  ASSERT_TRUE(build_legs({body.path, body.text, "", &client}, p, d, std::nullopt, std::nullopt, LegOptions(), Rng(),
                         &again)
                  .is_ok());
  EXPECT_EQ(json_object_parses(), before) << "no parse of the client body when building legs";
  EXPECT_EQ(built.prefill.body_text(), Build(body, p, d).prefill.body_text());
  EXPECT_EQ(built.decode.body_text(), body.text);
  EXPECT_EQ(built.decode.body.rendered_size(), body.text.size());
  EXPECT_EQ(built.prefill.body.original().data(), client.original().data()) << "bytes shared, not copied";

  const uint64_t before_finish = json_object_parses();
  ASSERT_TRUE(finish_decode_leg(built.plan, &built.decode, R"({"kv_transfer_params":{"remote_engine_id":"e"}})")
                  .is_ok());
  EXPECT_EQ(json_object_parses() - before_finish, 2u) << "the answer and its kv_transfer_params only";
  // The no-KV fallback edits the unrendered decode: no parse either.
  const uint64_t before_fallback = json_object_parses();
  EXPECT_TRUE(decode_without_kv(built.plan, &built.decode));
  EXPECT_EQ(json_object_parses(), before_fallback);
  EXPECT_FALSE(json::parse(built.decode.body_text()).contains("kv_transfer_params"));
}

TEST(ParseOnce, RenderIntoAppendsExactlyTheRenderedBytes) {
  for (const Body& body : Bodies()) {
    // SGLang appends members, MoRIIO replaces and removes some.
    const LegBuild b = Build(body, Plain(Connector::kSglang, "127.0.10.1", 8100),
                             Plain(Connector::kSglang, "127.0.10.2", 8200));
    for (const LegRequest* leg : {&b.prefill, &b.decode}) {
      std::string wire = "HEAD";
      leg->body.render_into(&wire);
      EXPECT_EQ(wire, "HEAD" + leg->body_text());
      EXPECT_EQ(leg->body.rendered_size(), leg->body_text().size());
    }
  }
}

TEST(LegHeaders, StorageOfLegsGoneCarriesNoValueIntoTheNextLegs) {
  // Legs hand their header storage to the thread's spares when destroyed; the next legs built on
  // the thread reuse it and must hold exactly their own headers.
  LegInstance p = Plain(Connector::kNixl, "127.0.10.1", 8100);
  p.dp_size = 4;
  LegOptions key;
  key.upstream_api_key = std::string(300, 'k');  // longer than the spares keep: freed, not kept
  {
    LegBuild first;
    ASSERT_TRUE(build_legs({"/v1/completions", "{}", "Bearer client"}, p, p, 3, 2, key, Rng(), &first)
                    .is_ok());
    EXPECT_EQ(first.prefill.headers.size(), 4u);
    EXPECT_EQ(*first.prefill.header("X-data-parallel-rank"), "3");
    EXPECT_EQ(*first.prefill.header("Authorization"), "Bearer " + std::string(300, 'k'));
  }
  for (int round = 0; round < 3; ++round) {
    const LegInstance plain = Plain(Connector::kNixl, "127.0.10.1", 8100);
    LegBuild next;
    ASSERT_TRUE(build_legs({"/v1/chat/completions", "{}", round == 1 ? "Bearer c" : ""}, plain, plain,
                           std::nullopt, std::nullopt, {}, Rng(), &next)
                    .is_ok());
    for (const LegRequest* leg : {&next.prefill, &next.decode}) {
      std::vector<std::pair<std::string, std::string>> want = {{"Content-Type", "application/json"}};
      if (round == 1) want.emplace_back("Authorization", "Bearer c");
      want.emplace_back("X-Request-Id", next.plan.request_id);
      EXPECT_EQ(leg->headers, want) << round;
    }
  }
}

}  // namespace
}  // namespace pdr::proto
