// The access log's line encoder and traceparent reader (router/clients/access_record.h): every
// line is one JSON object whatever bytes its strings hold.
#include "router/clients/access_record.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace pdr::router::clients {
namespace {

using json = nlohmann::json;

json line_of(const AccessRecord& r) {
  std::string out;
  append_access_line(r, &out);
  EXPECT_EQ(out.back(), '\n');
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;  // one line
  return json::parse(out);                           // throws (fails the test) if not JSON
}

TEST(AccessRecord, EveryFieldInOrder) {
  AccessRecord r;
  r.time = std::chrono::system_clock::time_point(std::chrono::milliseconds(1795850649123));  // 2026-11-28T...
  r.request_id = "req-1";
  r.trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
  r.client = "127.0.0.1";
  r.tenant = "team-a";
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.status = 200;
  r.outcome = "done";
  r.stream = true;
  r.prefill = "127.0.0.1:8100";
  r.decode = "127.0.0.1:8200";
  r.decode_rank = 1;
  r.retries = 2;
  r.prompt_tokens = 12;
  r.output_tokens = 16;
  r.cache_source = "kv_events";
  r.cache_matched = 64;
  r.cache_prompt = 100;
  r.ttft_ms = 12.5;
  r.total_ms = 40.25;
  r.bytes_in = 321;
  r.bytes_out = 4567;
  std::string text;
  append_access_line(r, &text);
  const json j = json::parse(text);
  const std::vector<std::string> keys = {
      "time", "request_id", "trace_id", "client", "tenant", "method", "path", "status", "outcome", "stream",
      "prefill", "decode", "prefill_rank", "decode_rank", "retries", "prompt_tokens", "output_tokens",
      "cache_source", "cache_matched", "cache_prompt", "queue_ms", "ttft_ms", "total_ms", "bytes_in", "bytes_out"};
  size_t at = 0;
  for (const std::string& key : keys) {  // present, in this order
    const size_t pos = text.find("\"" + key + "\":", at);
    ASSERT_NE(pos, std::string::npos) << key;
    at = pos;
  }
  EXPECT_EQ(j.size(), keys.size());
  EXPECT_EQ(j["time"], "2026-11-28T07:24:09.123Z");
  EXPECT_EQ(j["tenant"], "team-a");
  EXPECT_EQ(j["status"], 200);
  EXPECT_EQ(j["stream"], true);
  EXPECT_TRUE(j["prefill_rank"].is_null());
  EXPECT_EQ(j["decode_rank"], 1);
  EXPECT_EQ(j["retries"], 2);
  EXPECT_EQ(j["cache_matched"], 64);
  EXPECT_EQ(j["queue_ms"], 0.0);
  EXPECT_DOUBLE_EQ(j["ttft_ms"].get<double>(), 12.5);
  EXPECT_DOUBLE_EQ(j["total_ms"].get<double>(), 40.25);
  EXPECT_EQ(j["bytes_out"], 4567);
}

TEST(AccessRecord, UnknownsAreNull) {
  AccessRecord r;
  r.outcome = "refused";
  r.status = 401;
  const json j = line_of(r);
  for (const char* key : {"request_id", "trace_id", "prefill", "decode", "prompt_tokens", "output_tokens",
                          "cache_source", "cache_matched", "cache_prompt", "ttft_ms"}) {
    EXPECT_TRUE(j[key].is_null()) << key;
  }
  EXPECT_EQ(j["outcome"], "refused");
}

TEST(AccessRecord, StringsAreEscaped) {
  AccessRecord r;
  r.tenant = std::string("q\"b\\s/\n\r\t\x01\x1f\x7f end", 16);
  r.path = "/caf\xc3\xa9/\xf0\x9f\x98\x80";  // valid UTF-8 kept as it is
  r.method = "G\xff\xc3(\xed\xa0\x80T";       // invalid bytes, a bad continuation, a surrogate
  std::string text;
  append_access_line(r, &text);
  EXPECT_NE(text.find(R"("tenant":"q\"b\\s/\n\r\t\u0001\u001f\u007f end")"), std::string::npos) << text;
  const json j = json::parse(text);
  EXPECT_EQ(j["tenant"], std::string("q\"b\\s/\n\r\t\x01\x1f\x7f end", 16));
  EXPECT_EQ(j["path"], "/caf\xc3\xa9/\xf0\x9f\x98\x80");
  EXPECT_EQ(j["method"], "G\xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbdT");
}

TEST(AccessRecord, JsonTextOfEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  std::string out;
  append_json_text(&out, all);
  const json j = json::parse(out);  // a valid JSON string whatever the bytes
  const std::string back = j.get<std::string>();
  EXPECT_EQ(back.substr(0, 128), all.substr(0, 128));  // ASCII round-trips exactly
}

TEST(AccessRecord, TraceIdOfTraceparent) {
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(trace_id_of("00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"), "4bf92f3577b34da6a3ce929d0e0e4736");
  // A later version may add fields.
  EXPECT_EQ(trace_id_of("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what"),
            "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x"), "");
  EXPECT_EQ(trace_id_of("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("00-00000000000000000000000000000000-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"), "");
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"), "");
  EXPECT_EQ(trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"), "");
  EXPECT_EQ(trace_id_of(""), "");
  EXPECT_EQ(trace_id_of("\"><script>"), "");
}

}  // namespace
}  // namespace pdr::router::clients
