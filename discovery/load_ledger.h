// What pdrouter itself has put on each node, per node and per DP rank: requests in flight,
// uncached prefill tokens queued, decode sequences running and the KV tokens they hold, plus
// online estimates of the node's prefill throughput and decode step time. Routing policies read
// it (a predicted-latency policy needs more than one number per node); /status and /metrics show
// it (router/status_page.cc, router/node_load_metrics.cc).
//
// The ledger lives in the node's liveness cell (instance.h: InstanceLiveness::ledger), shared by
// every copy of its Instance across snapshots. Only LoadCharge (load_charge.h) changes the
// counters: each charge is a handle that gives back exactly what it took, exactly once, to the
// cell it took it from (it holds that cell), so no restart, re-registration, drain, ejection,
// reload or removal of the node can leave a counter negative or stuck above zero. The node's
// total of requests in flight is InstanceLiveness::outstanding (what least_outstanding and
// power_of_two read); the other totals are here.
//
// Per DP rank: one slot per rank up to kMaxLedgerRanks, allocated once per cell on its first
// charge (sized by the node's dp_size then), plus one slot for every rank beyond (a dp_size over
// kMaxLedgerRanks, or a dp_size that grew after the slots were made): the slots always sum to
// the node's totals.
//
// Thread-safe: relaxed atomics (each counter is independently meaningful; a reader may see one
// leg's charge on a rank before the node total); no allocation after the first charge. The one
// lock is the prefill busy clock's, taken when a prefill leg starts and ends (never on a read).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

namespace pdr::discovery {

inline constexpr uint32_t kMaxLedgerRanks = 256;

// A copy of one set of counters at one moment.
struct LoadFigures {
  uint32_t requests = 0;                 // requests (legs) in flight
  uint64_t queued_prefill_tokens = 0;    // uncached prompt tokens of prefill legs not yet answered
  uint32_t decode_sequences = 0;         // decode legs running
  uint64_t kv_tokens = 0;                // KV tokens those hold (prompt + generated so far, estimated)
  LoadFigures& operator+=(const LoadFigures& o) {
    requests += o.requests;
    queued_prefill_tokens += o.queued_prefill_tokens;
    decode_sequences += o.decode_sequences;
    kv_tokens += o.kv_tokens;
    return *this;
  }
  friend bool operator==(const LoadFigures&, const LoadFigures&) = default;
};

// One set of live counters: a node's totals (requests aside) or one DP rank's.
struct LoadCounters {
  std::atomic<uint32_t> requests{0};
  std::atomic<uint64_t> queued_prefill_tokens{0};
  std::atomic<uint32_t> decode_sequences{0};
  std::atomic<uint64_t> kv_tokens{0};
  LoadFigures read() const;
};

// An exponentially weighted moving average of a positive rate, updated lock-free by any thread.
// Robust to outliers: once kWarmup samples are in, a sample is clamped to within kClamp times
// the estimate before it is averaged in (one stray sample moves it by at most alpha * (kClamp -
// 1), a real change still gets there in a few dozen samples); non-finite and non-positive
// samples are ignored; the estimate stays within [kMin, kMax].
class RateEstimate {
 public:
  static constexpr double kAlpha = 0.2;
  static constexpr double kClamp = 2.0;
  static constexpr uint64_t kWarmup = 3;
  static constexpr double kMin = 1e-9, kMax = 1e12;

  struct Reading {
    double value = 0;      // 0: no estimate yet
    uint64_t samples = 0;  // samples averaged in so far
    std::chrono::steady_clock::duration age{};  // since the last sample (0 when none)
    bool present() const { return samples != 0; }
  };

  void add(double sample, std::chrono::steady_clock::time_point now);
  Reading read(std::chrono::steady_clock::time_point now) const;

 private:
  std::atomic<uint64_t> bits_{0};     // the double estimate's bits
  std::atomic<uint64_t> samples_{0};
  std::atomic<int64_t> last_ns_{0};   // steady_clock ns of the last sample
};

class LoadLedger {
 public:
  LoadLedger() = default;
  ~LoadLedger();
  LoadLedger(const LoadLedger&) = delete;
  LoadLedger& operator=(const LoadLedger&) = delete;

  // The node's totals; `requests` is filled in by node_load() (load_charge.h) from
  // InstanceLiveness::outstanding.
  LoadFigures totals() const { return totals_.read(); }
  // Rank slots made so far (0 before the first charge); rank(i) for i below it.
  uint32_t rank_slots() const;
  LoadFigures rank(uint32_t i) const;
  // Every rank at or above rank_slots(), together.
  LoadFigures beyond() const;

  // Uncached prompt tokens a second the node computes: its service rate, fed by the prefill busy
  // clock below.
  RateEstimate prefill_tokens_per_second;

  // The prefill busy clock (LoadCharge calls these when a charge's queued prefill tokens appear
  // and go). It measures the rate as uncached tokens answered over the time the node had at least
  // one of pdrouter's prefill legs in flight. Per-leg latency would count a leg's wait behind
  // earlier legs as work: a loaded node would look slow, and a policy dividing the queued tokens
  // by that rate would count its queue twice. A sample is taken when the node goes idle (with at
  // least kMinRateTokens answered), or once kRateWindowTokens were answered in one busy stretch:
  // concurrent legs finish in batches, and a window of several legs evens out which leg a batch's
  // time fell to. A leg given up (failed, cancelled) adds busy time and no tokens.
  static constexpr uint64_t kMinRateTokens = 16;
  static constexpr uint64_t kRateWindowTokens = 65536;
  void prefill_leg_started(std::chrono::steady_clock::time_point now);
  void prefill_leg_ended(uint64_t answered_tokens, std::chrono::steady_clock::time_point now);
  // Seconds between streamed tokens of a decode leg (first to last data event, over the events
  // in between).
  RateEstimate decode_step_seconds;

 private:
  friend class LoadCharge;
  struct Ranks {
    uint32_t count = 0;                      // slots for ranks 0..count-1; slot[count]: beyond
    std::unique_ptr<LoadCounters[]> slots;   // count + 1
  };
  // The slot of `rank` (allocating the slots, sized by dp_size, on first use). Never null.
  LoadCounters* slot(uint32_t dp_size, uint32_t rank);

  LoadCounters totals_;  // requests unused: InstanceLiveness::outstanding is the total
  std::mutex prefill_clock_mu_;
  uint32_t prefill_legs_ = 0;                         // legs in flight
  std::chrono::steady_clock::time_point busy_mark_{}; // busy time counted up to here
  double busy_seconds_ = 0;                           // of the current window
  uint64_t answered_tokens_ = 0;                      // of the current window
  std::atomic<Ranks*> ranks_{nullptr};
};

}  // namespace pdr::discovery
