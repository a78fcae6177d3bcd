// One client request as the access log writes it (access_log.h), and its JSON line.
//
// The line is one JSON object and a newline, fields always present and in this order (null when
// unknown):
//   time           end of the request, UTC, RFC 3339 with milliseconds ("2026-11-28T07:24:09.123Z")
//   request_id     the id both legs got (X-Request-Id of the answer); null before pairing
//   trace_id       the W3C trace id of the client's `traceparent` header (32 hex digits), or null
//   client         the client's address (without its port)
//   tenant         the request's tenant (its key's, its tenant header's, or "default")
//   method, path   the request's (the path as routed: decoded and normalised, without the query)
//   status         the HTTP status the client got (a stream: the status it started with)
//   outcome        done, failed (pdrouter answered an error or ended a stream with one),
//                  cancelled (the client left), refused (turned away before any node work:
//                  bad key, a tenant limit, admission, a request pdrouter itself refuses)
//   stream         the answer was an event stream
//   prefill, decode        the nodes of the last attempt (host:port), null when none
//   prefill_rank, decode_rank   their DP ranks, null when the node has one
//   retries        legs retried on another node
//   prompt_tokens, output_tokens   from the answer's usage (null when it had none)
//   cache_source, cache_matched, cache_prompt   cache-aware routing's lookup: kv_events (tokens)
//                  or prefix_tree (bytes), what the chosen prefill held and the prompt's size;
//                  null without a lookup
//   queue_ms       time waiting in the admission queue (router/proxy/admission_queue.h; 0: none)
//   ttft_ms        arrival (head parsed) to the first answer byte sent; null if none was
//   total_ms       arrival to the end
//   bytes_in       request body bytes; bytes_out: answer body bytes sent
// Strings are escaped as JSON requires (quote, backslash, control characters as \u00XX) and a
// byte that is not part of valid UTF-8 is written as U+FFFD, so every line parses.
// Pure.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pdr::router::clients {

struct AccessRecord {
  std::chrono::system_clock::time_point time{};
  std::string request_id;
  std::string trace_id;  // "" = none
  std::string client;
  std::string tenant;
  std::string method;
  std::string path;
  int status = 0;
  std::string_view outcome = "done";  // a literal
  bool stream = false;
  std::string prefill, decode;  // "" = none
  std::optional<uint32_t> prefill_rank, decode_rank;
  uint32_t retries = 0;
  std::optional<uint64_t> prompt_tokens, output_tokens;
  std::string_view cache_source;  // a literal; "" = no lookup
  uint32_t cache_matched = 0, cache_prompt = 0;
  double queue_ms = 0;
  std::optional<double> ttft_ms;
  double total_ms = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};

// Appends the record's line (with its newline) to *out.
void append_access_line(const AccessRecord& record, std::string* out);

// Appends `text` as a JSON string literal (see above for what is escaped or replaced).
void append_json_text(std::string* out, std::string_view text);

// The trace id of a W3C traceparent value ("00-<32 hex>-<16 hex>-<2 hex>", version not "ff",
// ids not all zero), lower case; "" when the value is not one.
std::string trace_id_of(std::string_view traceparent);

}  // namespace pdr::router::clients
