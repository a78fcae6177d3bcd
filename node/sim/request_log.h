// SimRequestLog: what `pdnode sim` received and how it answered, for GET /sim/requests.
//
// Thread-safe (one mutex); any worker records and updates entries. Keeps the newest 256 entries;
// updates to an entry already dropped are ignored (counters still move).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "router/http/http_message.h"

namespace pdr::node::sim {

class SimRequestLog {
 public:
  static constexpr size_t kCapacity = 256;

  // Records an arrival; returns its sequence number for later updates.
  uint64_t record(const http::Request& request);
  void set_status(uint64_t seq, int status);
  void mark_aborted(uint64_t seq);
  // Notes that an injected fault (FaultSpec::to_json(), a JSON object) applied to the request.
  void set_fault(uint64_t seq, std::string fault_json);
  void count_error(std::string_view reason);
  // The prefix cache's answer for a generation request (prefix_cache.h): its entry's
  // "cached_tokens" (null until set) and the counters prefix_cache_queries, _queried_tokens,
  // _hit_tokens and _hits (requests with cached tokens).
  void set_prefix_cache(uint64_t seq, uint32_t cached_tokens, uint32_t queried_tokens);
  // A prefill leg that pulled a conversation's KV from the decode that served its last turn
  // (--bidirectional-kv-xfer on both): its entry's "kv_reused_tokens" (the tokens of the blocks
  // pulled; null when none) and the counter kv_reused_tokens.
  void set_kv_reused(uint64_t seq, uint32_t tokens);
  void reset();
  // {"requests":[...], "counters":{"requests":N,"aborts":N,"faults_applied":N,
  //  "prefix_cache_queries":N,"prefix_cache_queried_tokens":N,"prefix_cache_hit_tokens":N,
  //  "prefix_cache_hits":N,"errors_by_reason":{...}}}; an entry's "fault" is the injected fault
  //  object, or null; its "cached_tokens" the prompt tokens found in the prefix cache, or null.
  std::string to_json() const;

 private:
  struct Entry {
    uint64_t seq = 0;
    std::string method;
    std::string path;
    std::string target;
    std::map<std::string, std::string> headers;  // lower-cased names; a repeated name keeps the last
    std::string body;
    double arrival_unix_ms = 0;
    int status = 0;
    bool aborted = false;
    std::string fault;  // FaultSpec::to_json(); empty: none
    int64_t cached_tokens = -1;  // -1: not looked up
    int64_t kv_reused_tokens = -1;  // -1: nothing pulled from a decode
  };
  Entry* find(uint64_t seq);

  mutable std::mutex mutex_;
  std::deque<Entry> entries_;
  uint64_t next_seq_ = 1;
  uint64_t requests_ = 0;
  uint64_t aborts_ = 0;
  uint64_t faults_applied_ = 0;
  uint64_t prefix_queries_ = 0;
  uint64_t prefix_queried_tokens_ = 0;
  uint64_t prefix_hit_tokens_ = 0;
  uint64_t prefix_hits_ = 0;
  uint64_t kv_reused_tokens_ = 0;
  std::map<std::string, uint64_t> errors_by_reason_;
};

}  // namespace pdr::node::sim
