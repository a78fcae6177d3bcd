#include "node/sim/request_log.h"

#include <chrono>

#include <nlohmann/json.hpp>

namespace pdr::node::sim {

uint64_t SimRequestLog::record(const http::Request& request) {
  Entry entry;
  entry.method = request.method;
  entry.path = request.path;
  entry.target = request.target;
  for (const http::Header& h : request.headers) {
    std::string name = h.name;
    for (char& c : name) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    entry.headers[name] = h.value;
  }
  entry.body = request.body;
  entry.arrival_unix_ms =
      std::chrono::duration<double, std::milli>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::lock_guard<std::mutex> lock(mutex_);
  entry.seq = next_seq_++;
  ++requests_;
  entries_.push_back(std::move(entry));
  if (entries_.size() > kCapacity) entries_.pop_front();
  return entries_.back().seq;
}

SimRequestLog::Entry* SimRequestLog::find(uint64_t seq) {
  if (entries_.empty() || seq < entries_.front().seq) return nullptr;
  const uint64_t index = seq - entries_.front().seq;  // seqs are consecutive within the deque
  return index < entries_.size() ? &entries_[index] : nullptr;
}

void SimRequestLog::set_status(uint64_t seq, int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Entry* e = find(seq)) e->status = status;
}

void SimRequestLog::mark_aborted(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++aborts_;
  if (Entry* e = find(seq)) e->aborted = true;
}

void SimRequestLog::set_fault(uint64_t seq, std::string fault_json) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++faults_applied_;
  if (Entry* e = find(seq)) e->fault = std::move(fault_json);
}

void SimRequestLog::count_error(std::string_view reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++errors_by_reason_[std::string(reason)];
}

void SimRequestLog::set_prefix_cache(uint64_t seq, uint32_t cached_tokens,
                                     uint32_t queried_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++prefix_queries_;
  prefix_queried_tokens_ += queried_tokens;
  prefix_hit_tokens_ += cached_tokens;
  if (cached_tokens > 0) ++prefix_hits_;
  if (Entry* e = find(seq)) e->cached_tokens = cached_tokens;
}

void SimRequestLog::set_kv_reused(uint64_t seq, uint32_t tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  kv_reused_tokens_ += tokens;
  if (Entry* e = find(seq)) e->kv_reused_tokens = tokens;
}

void SimRequestLog::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Sequence numbers keep counting so updates for requests still in flight find nothing.
  entries_.clear();
  requests_ = 0;
  aborts_ = 0;
  faults_applied_ = 0;
  prefix_queries_ = prefix_queried_tokens_ = prefix_hit_tokens_ = prefix_hits_ = 0;
  errors_by_reason_.clear();
}

std::string SimRequestLog::to_json() const {
  using nlohmann::json;
  std::lock_guard<std::mutex> lock(mutex_);
  json list = json::array();
  for (const Entry& e : entries_) {
    // Bodies are arbitrary bytes; invalid UTF-8 is replaced so the dump cannot throw.
    list.push_back(json{{"seq", e.seq},
                        {"method", e.method},
                        {"path", e.path},
                        {"target", e.target},
                        {"headers", e.headers},
                        {"body", e.body},
                        {"arrival_unix_ms", e.arrival_unix_ms},
                        {"status", e.status},
                        {"aborted", e.aborted},
                        {"fault", e.fault.empty() ? json(nullptr)
                                                  : json::parse(e.fault, nullptr, false)},
                        {"cached_tokens",
                         e.cached_tokens < 0 ? json(nullptr) : json(e.cached_tokens)},
                        {"kv_reused_tokens",
                         e.kv_reused_tokens < 0 ? json(nullptr) : json(e.kv_reused_tokens)}});
  }
  json out{{"requests", list},
           {"counters",
            {{"requests", requests_},
             {"aborts", aborts_},
             {"faults_applied", faults_applied_},
             {"prefix_cache_queries", prefix_queries_},
             {"prefix_cache_queried_tokens", prefix_queried_tokens_},
             {"prefix_cache_hit_tokens", prefix_hit_tokens_},
             {"prefix_cache_hits", prefix_hits_},
             {"kv_reused_tokens", kv_reused_tokens_},
             {"errors_by_reason", errors_by_reason_}}}};
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace pdr::node::sim
