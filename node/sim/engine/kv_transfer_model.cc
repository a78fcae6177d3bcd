#include "node/sim/engine/kv_transfer_model.h"

#include <algorithm>
#include <limits>

namespace pdr::node::sim {
namespace {
// What is left after moving for the exact time the rest needed is rounding error: a transfer
// with less than a picosecond's worth of bytes to go is done.
constexpr double kDoneMs = 1e-9;
}  // namespace

KvTransferModel::KvTransferModel(double latency_ms, double transfer_gbps, double node_gbps)
    : latency_ms_(latency_ms),
      transfer_bytes_per_ms_(transfer_gbps * 1e6),
      node_bytes_per_ms_(node_gbps * 1e6) {}

double KvTransferModel::rate_per_flow(size_t moving) const {
  if (moving == 0) return transfer_bytes_per_ms_;
  return std::min(transfer_bytes_per_ms_, node_bytes_per_ms_ / static_cast<double>(moving));
}

size_t KvTransferModel::moving_at(double t) const {
  size_t n = 0;
  for (const Flow& f : flows_) n += f.moving_from <= t ? 1 : 0;
  return n;
}

// Moves every transfer's bytes from now_ to t, at the rates of now_ (no transfer starts or ends
// moving in between: the callers stop at each such moment).
void KvTransferModel::progress_to(double t) {
  if (t <= now_) return;
  const double rate = rate_per_flow(moving_at(now_));
  for (Flow& f : flows_) {
    if (f.moving_from > now_) continue;
    f.bytes_left -= rate * (t - now_);
    if (f.bytes_left < rate * kDoneMs) f.bytes_left = 0;
  }
  now_ = t;
}

void KvTransferModel::start(uint64_t id, uint64_t bytes, double now_ms) {
  advance(now_ms);  // rates change from now on; the finished ones are reported by the next advance
  flows_.push_back({id, std::max(now_ms, now_) + latency_ms_, static_cast<double>(bytes)});
}

void KvTransferModel::cancel(uint64_t id, double now_ms) {
  progress_to(std::max(now_ms, now_));
  std::erase_if(flows_, [id](const Flow& f) { return f.id == id; });
}

std::optional<double> KvTransferModel::next_completion_ms() const {
  if (flows_.empty()) return std::nullopt;
  // Either a transfer still in its latency starts moving (rates change) or a moving one finishes.
  double next = std::numeric_limits<double>::infinity();
  const double rate = rate_per_flow(moving_at(now_));
  for (const Flow& f : flows_) {
    if (f.moving_from > now_) {
      next = std::min(next, f.moving_from + f.bytes_left / transfer_bytes_per_ms_);
    } else {
      next = std::min(next, now_ + f.bytes_left / rate);
    }
  }
  return next;
}

std::vector<uint64_t> KvTransferModel::advance(double now_ms) {
  std::vector<uint64_t> done;
  while (true) {
    // The next moment anything changes: a latency ends or a moving transfer finishes.
    double next = std::numeric_limits<double>::infinity();
    const double rate = rate_per_flow(moving_at(now_));
    for (const Flow& f : flows_) {
      next = std::min(next, f.moving_from > now_ ? f.moving_from : now_ + f.bytes_left / rate);
    }
    if (next > now_ms) break;
    progress_to(next);
    now_ = std::max(now_, next);
    for (auto it = flows_.begin(); it != flows_.end();) {
      if (it->moving_from <= now_ && it->bytes_left <= 0) {
        done.push_back(it->id);
        it = flows_.erase(it);
      } else {
        ++it;
      }
    }
  }
  progress_to(now_ms);
  return done;
}

}  // namespace pdr::node::sim
