// The orphaned prefill legs of one worker, listed per prefill node (proxy_session.h: a concurrent
// dialect's prefill leg still open when its request ended).
//
// An orphan costs its prefill node work and pdrouter a socket until it answers or its grace
// (timeouts.orphan_grace_ms) ends. It holds no client's admission slot: one prefill that never
// answers must not make pdrouter refuse clients. What bounds orphans instead is
// limits.max_orphan_legs_per_node: each worker keeps at most per_worker_limit() of them per
// prefill node, and a new orphan over that closes the oldest one of its node (counted in
// pdrouter_orphan_prefill_evictions_total).
//
// Worker thread only: each WorkerContext owns one; entries are the worker's own sessions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

namespace pdr::router::proxy {

class ProxySession;

class OrphanLegs {
 public:
  // The share of limits.max_orphan_legs_per_node `limit` one of `workers` workers keeps (rounded
  // up, so a worker keeps at least one while the limit is not 0). 0: no orphan is kept.
  static size_t per_worker_limit(uint32_t limit, uint32_t workers);

  // Lists `session` as an orphan of prefill `node` and returns its id. When the node's list is
  // then longer than `limit` (> 0), its oldest entry is taken off the list into `*evict` (the
  // caller closes it); else `*evict` is left empty.
  uint64_t add(const std::string& node, std::weak_ptr<ProxySession> session, size_t limit,
               std::weak_ptr<ProxySession>* evict);
  // Takes an orphan off its node's list (nothing if it is not listed any more).
  void remove(const std::string& node, uint64_t id);

  size_t size() const { return size_; }  // orphans listed on this worker

 private:
  struct Entry {
    uint64_t id;
    std::weak_ptr<ProxySession> session;
  };
  std::unordered_map<std::string, std::deque<Entry>> by_node_;  // oldest first
  uint64_t next_id_ = 1;
  size_t size_ = 0;
};

}  // namespace pdr::router::proxy
