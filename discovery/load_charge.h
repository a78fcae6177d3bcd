// LoadCharge: the only way to change a node's load ledger (load_ledger.h) and its requests in
// flight (InstanceLiveness::outstanding). A charge is a handle: movable, not copyable; it holds
// the liveness cell it charged (a shared_ptr) and the amounts it added, and gives back exactly
// those amounts to that cell, once: when released in part (prefill_done, decode_done), in whole
// (release) or destroyed. A moved-from handle holds nothing. So:
//  - a counter can never go below zero: every subtraction is of an amount the same handle added
//    to the same atomic before it (one modification order per atomic);
//  - nothing leaks: whatever path ends a request (answer, error, retry on another node,
//    cancellation, timeout, a session destroyed early) ends its handles;
//  - a node that restarts, re-registers, is drained, ejected, reloaded or removed keeps the
//    counters of the cell the charge was taken on consistent: a new cell (a new Instance after a
//    removal) starts at zero and the old one returns to zero as its charges end.
//
// Not thread-safe per handle (one owner: a session on its worker); any number of handles on one
// node from any threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "discovery/instance.h"
#include "discovery/load_ledger.h"

namespace pdr::discovery {

class LoadCharge {
 public:
  LoadCharge() = default;  // bound to nothing, holds nothing
  // Bound to `node`'s cell on DP rank `rank` (none: rank 0); `request`: one request in flight
  // charged at once (false: token-only charges, e.g. an orphaned prefill's queued tokens).
  LoadCharge(const Instance& node, std::optional<uint32_t> rank, bool request = true);
  ~LoadCharge() { release(); }
  LoadCharge(LoadCharge&& other) noexcept;
  LoadCharge& operator=(LoadCharge&& other) noexcept;
  LoadCharge(const LoadCharge&) = delete;
  LoadCharge& operator=(const LoadCharge&) = delete;

  bool bound() const { return cell_ != nullptr; }
  // The cell charged (null when unbound): its rate estimates take the leg's samples.
  InstanceLiveness* cell() const { return cell_.get(); }
  uint32_t rank() const { return rank_; }
  // What this handle holds now.
  const LoadFigures& held() const { return held_; }

  // Adds uncached prefill tokens queued on the node (no-op when unbound). The first starts a leg
  // on the node's prefill busy clock (load_ledger.h).
  void queue_prefill(uint64_t tokens);
  // The prompt was computed (the prefill answered, or a decode serving alone did it): gives back
  // every queued prefill token this handle holds, and they count as answered on the busy clock.
  // release() with tokens still queued ends the leg as given up.
  void prefill_done();
  // One decode sequence starts, holding `kv_tokens` (its prompt); add_kv_tokens grows it as
  // tokens are generated. A second start_decode on the same handle only adds KV tokens.
  void start_decode(uint64_t kv_tokens);
  void add_kv_tokens(uint64_t tokens);
  // Gives back the decode sequence and its KV tokens.
  void decode_done();
  // Moves everything held to another rank of the same node (node totals unchanged).
  void move_to_rank(std::optional<uint32_t> rank);
  // Gives back everything and unbinds.
  void release();

 private:
  void take(LoadCounters& c, const LoadFigures& f);
  void give(LoadCounters& c, const LoadFigures& f);

  std::shared_ptr<InstanceLiveness> cell_;
  LoadCounters* slot_ = nullptr;  // the rank's counters inside cell_->ledger
  uint32_t dp_size_ = 1;
  uint32_t rank_ = 0;
  LoadFigures held_;
};

// The node's totals (requests from InstanceLiveness::outstanding).
LoadFigures node_load(const InstanceLiveness& live);

}  // namespace pdr::discovery
