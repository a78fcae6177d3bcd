// Load charges (contracts in load_charge.h).
#include "discovery/load_charge.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace pdr::discovery {

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
}

LoadCharge::LoadCharge(const Instance& node, std::optional<uint32_t> rank, bool request)
    : cell_(node.liveness), dp_size_(std::max<uint32_t>(1, node.dp_size)), rank_(rank.value_or(0)) {
  if (!cell_) return;
  slot_ = cell_->ledger.slot(dp_size_, rank_);
  if (request) {
    held_.requests = 1;
    cell_->outstanding.fetch_add(1, kRelaxed);
    slot_->requests.fetch_add(1, kRelaxed);
  }
}

LoadCharge::LoadCharge(LoadCharge&& other) noexcept
    : cell_(std::move(other.cell_)),
      slot_(std::exchange(other.slot_, nullptr)),
      dp_size_(other.dp_size_),
      rank_(other.rank_),
      held_(std::exchange(other.held_, LoadFigures{})) {}

LoadCharge& LoadCharge::operator=(LoadCharge&& other) noexcept {
  if (this != &other) {
    release();
    cell_ = std::move(other.cell_);
    slot_ = std::exchange(other.slot_, nullptr);
    dp_size_ = other.dp_size_;
    rank_ = other.rank_;
    held_ = std::exchange(other.held_, LoadFigures{});
  }
  return *this;
}

void LoadCharge::take(LoadCounters& c, const LoadFigures& f) {
  if (f.requests != 0) c.requests.fetch_add(f.requests, kRelaxed);
  if (f.queued_prefill_tokens != 0) c.queued_prefill_tokens.fetch_add(f.queued_prefill_tokens, kRelaxed);
  if (f.decode_sequences != 0) c.decode_sequences.fetch_add(f.decode_sequences, kRelaxed);
  if (f.kv_tokens != 0) c.kv_tokens.fetch_add(f.kv_tokens, kRelaxed);
}

void LoadCharge::give(LoadCounters& c, const LoadFigures& f) {
  if (f.requests != 0) c.requests.fetch_sub(f.requests, kRelaxed);
  if (f.queued_prefill_tokens != 0) c.queued_prefill_tokens.fetch_sub(f.queued_prefill_tokens, kRelaxed);
  if (f.decode_sequences != 0) c.decode_sequences.fetch_sub(f.decode_sequences, kRelaxed);
  if (f.kv_tokens != 0) c.kv_tokens.fetch_sub(f.kv_tokens, kRelaxed);
}

void LoadCharge::queue_prefill(uint64_t tokens) {
  if (!cell_ || tokens == 0) return;
  if (held_.queued_prefill_tokens == 0) cell_->ledger.prefill_leg_started(std::chrono::steady_clock::now());
  held_.queued_prefill_tokens += tokens;
  cell_->ledger.totals_.queued_prefill_tokens.fetch_add(tokens, kRelaxed);
  slot_->queued_prefill_tokens.fetch_add(tokens, kRelaxed);
}

void LoadCharge::prefill_done() {
  if (!cell_ || held_.queued_prefill_tokens == 0) return;
  const uint64_t tokens = std::exchange(held_.queued_prefill_tokens, 0);
  cell_->ledger.totals_.queued_prefill_tokens.fetch_sub(tokens, kRelaxed);
  slot_->queued_prefill_tokens.fetch_sub(tokens, kRelaxed);
  cell_->ledger.prefill_leg_ended(tokens, std::chrono::steady_clock::now());
}

void LoadCharge::start_decode(uint64_t kv_tokens) {
  if (!cell_) return;
  if (held_.decode_sequences == 0) {
    held_.decode_sequences = 1;
    cell_->ledger.totals_.decode_sequences.fetch_add(1, kRelaxed);
    slot_->decode_sequences.fetch_add(1, kRelaxed);
  }
  add_kv_tokens(kv_tokens);
}

void LoadCharge::add_kv_tokens(uint64_t tokens) {
  if (!cell_ || tokens == 0) return;
  held_.kv_tokens += tokens;
  cell_->ledger.totals_.kv_tokens.fetch_add(tokens, kRelaxed);
  slot_->kv_tokens.fetch_add(tokens, kRelaxed);
}

void LoadCharge::decode_done() {
  if (!cell_) return;
  LoadFigures f;
  f.decode_sequences = std::exchange(held_.decode_sequences, 0);
  f.kv_tokens = std::exchange(held_.kv_tokens, 0);
  give(cell_->ledger.totals_, f);
  give(*slot_, f);
}

void LoadCharge::move_to_rank(std::optional<uint32_t> rank) {
  if (!cell_ || rank.value_or(0) == rank_) return;
  LoadCounters* next = cell_->ledger.slot(dp_size_, rank.value_or(0));
  rank_ = rank.value_or(0);
  if (next == slot_) return;  // both beyond the slots
  take(*next, held_);
  give(*slot_, held_);
  slot_ = next;
}

void LoadCharge::release() {
  if (!cell_) return;
  // Queued tokens still held: the leg was given up, not answered.
  if (held_.queued_prefill_tokens != 0) cell_->ledger.prefill_leg_ended(0, std::chrono::steady_clock::now());
  if (held_.requests != 0) cell_->outstanding.fetch_sub(held_.requests, kRelaxed);
  LoadFigures totals = held_;
  totals.requests = 0;  // the node's total of requests is `outstanding`
  give(cell_->ledger.totals_, totals);
  give(*slot_, held_);
  held_ = LoadFigures{};
  slot_ = nullptr;
  cell_.reset();
}

LoadFigures node_load(const InstanceLiveness& live) {
  LoadFigures f = live.ledger.totals();
  f.requests = live.outstanding.load(kRelaxed);
  return f;
}

}  // namespace pdr::discovery
