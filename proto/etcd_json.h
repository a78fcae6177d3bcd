// etcd v3 JSON gateway messages (etcd 3.4: POST /v3/kv/put, /v3/kv/range, /v3/kv/deleterange,
// /v3/watch, /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke; api/etcdserverpb/rpc.proto
// rendered by grpc-gateway). Facts this codec follows, checked against etcd-server 3.4.23:
// - keys and values are base64 (standard alphabet, padded); int64 fields (revision, lease ID,
//   TTL, count) are JSON strings ("5"), a zero or false field is left out altogether;
// - a failed call answers {"error": "...", "message": "...", "code": N} (gRPC code) with an HTTP
//   error status; inside a stream the error is {"error": {"grpc_code": N, "message": "..."}};
// - /v3/watch and /v3/lease/keepalive wrap each answer in {"result": {...}}; a watch answer
//   stream is one JSON object per line; a watch event's "type" is absent for PUT, "DELETE" for
//   a deletion; a watch refused because its start revision was compacted answers
//   {"canceled": true, "compact_revision": "N"};
// - /v3/lease/keepalive for an expired or unknown lease answers with no "TTL" (TTL 0).
// Pure: no I/O. Every decoder bounds the size of what it accepts; `out` is untouched on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

// Limits on etcd answers (untrusted bytes): a whole answer (a range over 10,000 entries of a
// few KiB each fits), one watch-stream line, one key, one value.
inline constexpr size_t kMaxEtcdAnswerBytes = 64 * 1024 * 1024;
inline constexpr size_t kMaxEtcdWatchLineBytes = 16 * 1024 * 1024;
inline constexpr size_t kMaxEtcdKeyBytes = 4096;
inline constexpr size_t kMaxEtcdValueBytes = 1024 * 1024;

std::string base64_encode(std::string_view bytes);
// Strict: standard alphabet, padding required, no whitespace. False on anything else.
bool base64_decode(std::string_view text, std::string* out);

// The range_end that selects every key starting with `prefix` (the prefix with its last byte
// below 0xff incremented, trailing 0xff bytes dropped; "\0" for an empty prefix: every key).
std::string etcd_prefix_end(std::string_view prefix);

// Request bodies. lease 0 = no lease; start_revision 0 = from now.
std::string encode_etcd_put(std::string_view key, std::string_view value, int64_t lease);
std::string encode_etcd_range(std::string_view key, std::string_view range_end);
// One page of a range (etcd's RangeRequest limit / revision / keys_only; 0 and false are left
// out). The next page starts at the last key read plus a NUL byte, at the first page's revision,
// so the pages together are one consistent view.
struct EtcdRangePage {
  int64_t limit = 0;     // at most this many key-values; 0: all
  int64_t revision = 0;  // the store as of this revision; 0: the newest
  bool keys_only = false;
};
std::string encode_etcd_range_page(std::string_view key, std::string_view range_end, const EtcdRangePage& page);
std::string encode_etcd_delete_range(std::string_view key, std::string_view range_end);
std::string encode_etcd_lease_grant(int64_t ttl_seconds);
std::string encode_etcd_lease_id(int64_t id);  // keepalive and revoke
std::string encode_etcd_watch_create(std::string_view key, std::string_view range_end,
                                     int64_t start_revision);
std::string encode_etcd_authenticate(std::string_view name, std::string_view password);

struct EtcdKeyValue {
  std::string key;    // decoded
  std::string value;  // decoded; empty when refused
  // Non-empty: the value was not read, and why (over kMaxEtcdValueBytes, not base64). The rest
  // of the answer is read as usual: one writer's oversized value refuses that key-value only.
  std::string refused;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// The common part of every answer: the store revision it was made at, or the error etcd sent.
struct EtcdAnswer {
  int64_t revision = 0;
  bool is_error = false;
  int grpc_code = 0;
  std::string error;  // etcd's message when is_error
};

struct EtcdRangeAnswer {
  EtcdAnswer answer;
  std::vector<EtcdKeyValue> kvs;
  bool more = false;
  size_t skipped = 0;  // key-values left out: their key was over kMaxEtcdKeyBytes or not base64
  std::string last_key;  // the answer's last key, skipped or not ("" when it has none): pages
};

struct EtcdLeaseAnswer {
  EtcdAnswer answer;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds; 0 from keepalive: the lease is gone
};

struct EtcdEvent {
  bool is_delete = false;
  EtcdKeyValue kv;  // for a delete: key and mod_revision only
};

struct EtcdWatchAnswer {
  EtcdAnswer answer;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;  // > 0: the start revision was compacted, re-range
  std::string cancel_reason;
  std::vector<EtcdEvent> events;
  size_t skipped = 0;  // events left out: their key was over kMaxEtcdKeyBytes or not base64
};

// put, deleterange, revoke and any other answer whose only content pdrouter reads is the header.
// An error answer decodes fine (is_error); only bytes that are not such an answer fail.
// Errors: kTooLarge (the answer over its limit), kMalformed (not JSON), kWrongType, kOutOfRange
// (an int64 that does not parse). A key or value over its limit or not base64 is data some
// writer put in etcd, not a broken answer: it refuses that key-value only (EtcdKeyValue::refused,
// EtcdRangeAnswer::skipped, EtcdWatchAnswer::skipped).
Status parse_etcd_answer(std::string_view json, EtcdAnswer* out);
Status parse_etcd_range(std::string_view json, EtcdRangeAnswer* out);
Status parse_etcd_lease(std::string_view json, EtcdLeaseAnswer* out);  // grant and keepalive
// One line of a /v3/watch answer stream.
Status parse_etcd_watch(std::string_view json, EtcdWatchAnswer* out);
// /v3/auth/authenticate: {"header":..., "token": "..."}.
Status parse_etcd_token(std::string_view json, EtcdAnswer* answer, std::string* token);

// Splits a streamed answer body into lines (one JSON object each) as bytes arrive.
class EtcdLineSplitter {
 public:
  explicit EtcdLineSplitter(size_t max_line = kMaxEtcdWatchLineBytes) : max_line_(max_line) {}
  // Appends bytes. False (and the splitter is unusable) when a line grows over max_line.
  bool feed(std::string_view bytes);
  // The next complete line without its newline (blank lines skipped); false when none is
  // complete yet. The view is valid until the next feed() or next_line().
  bool next_line(std::string_view* line);

 private:
  size_t max_line_;
  std::string buffer_;
  size_t consumed_ = 0;
  bool broken_ = false;
};

}  // namespace pdr::proto
