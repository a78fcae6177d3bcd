// KvTransferModel: how long P/D KV transfers into one simulated node take when several run at
// once (node/sim/engine/profile.h: kv-transfer-latency-ms, kv-transfer-gbps, kv-node-gbps).
// Each transfer waits a fixed latency, then moves its bytes; the transfers moving bytes at the same
// moment share the node's bandwidth equally, none going faster than the per-transfer rate (a
// fluid model: rates change whenever a transfer starts or ends moving bytes). Alone, a transfer of
// B bytes takes latency + B / per-transfer rate.
//
// Times are modelled milliseconds from any origin; each call's `now` must not be earlier than the
// previous call's. Pure and single-threaded.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace pdr::node::sim {

class KvTransferModel {
 public:
  // Rates in GB/s (1e9 bytes per second), > 0.
  KvTransferModel(double latency_ms, double transfer_gbps, double node_gbps);

  void start(uint64_t id, uint64_t bytes, double now_ms);
  void cancel(uint64_t id, double now_ms);
  // The transfers done by `now_ms`, in the order they completed.
  std::vector<uint64_t> advance(double now_ms);
  // When the next one completes if nothing else starts, or none.
  std::optional<double> next_completion_ms() const;
  size_t active() const { return flows_.size(); }

 private:
  struct Flow {
    uint64_t id = 0;
    double moving_from = 0;  // ms: when its latency is over
    double bytes_left = 0;
  };
  double rate_per_flow(size_t moving) const;  // bytes per ms
  void progress_to(double t);
  size_t moving_at(double t) const;

  double latency_ms_;
  double transfer_bytes_per_ms_;
  double node_bytes_per_ms_;
  double now_ = 0;
  std::vector<Flow> flows_;
};

}  // namespace pdr::node::sim
