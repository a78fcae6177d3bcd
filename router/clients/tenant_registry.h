// Tenants: who a client request is for, and what each may use (topology tenants:).
//
// A request's tenant is its key's (client_auth.keys_file), else the value of tenants.header
// (only without client keys: a header any client can set is no identity once keys exist), else
// "default". Known tenants are those the key file or tenants.limits names, and "default"; every
// other name (a tenant header's value nobody listed, or one that is not a tenant name) is counted
// and limited as the one tenant "other", so metrics labels and limit state stay bounded by the
// configuration, whatever clients send.
//
// Each known tenant (and "other") has a TenantState shared by all workers: its limits
// (tenants.limits.<name>, else tenants.defaults) and the state they need:
//   requests_per_second / burst   a token bucket of requests, taken at the key check (every
//                                 client endpoint but /health and /ready); empty: 429
//   tokens_per_minute             a token bucket of tokens (capacity: one minute's worth) from
//                                 which a P/D request reserves its prompt (estimated) plus its
//                                 max_tokens at admission, settled when it ends (TenantTicket)
//   max_in_flight                 P/D and one-node requests at once (TenantTicket)
//   priority                      the admission queue class of its requests (not a limit:
//                                 router/proxy/admission_queue.h)
// A reload keeps each tenant's state (its buckets' levels carry over, capped by the new limits)
// for tenants that remain; a tenant removed from the configuration counts as "other" from then on.
//
// Threads: TenantTable is immutable once built and read by every worker; TenantState's counters
// are relaxed atomics and its buckets sit behind its own mutex (taken only while a limit is set).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/config/topology.h"
#include "proto/usage_scan.h"
#include "router/clients/token_bucket.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::clients {

// Why a tenant's request was refused (429).
enum class TenantRefusal : uint8_t {
  kRequestsPerSecond,  // its request bucket was empty
  kTokensPerMinute,    // its token bucket cannot hold the reservation now
  kTooLarge,           // the reservation is more than tokens_per_minute: it never will
  kInFlight,           // max_in_flight requests already running
};
constexpr size_t kTenantRefusalCount = 4;
std::string_view to_string(TenantRefusal why);  // "requests_per_second", ...

struct TenantState {
  using Clock = TokenBucket::Clock;
  explicit TenantState(std::string name_) : name(std::move(name_)) {}

  const std::string name;  // the metrics label: a known tenant's name, or "other"

  // Limits as last applied (relaxed: a reload's new limits reach each worker's next request).
  std::atomic<uint32_t> requests_per_second{0}, tokens_per_minute{0}, max_in_flight{0};
  std::atomic<uint32_t> priority{config::Topology::TenantLimits{}.priority};

  std::atomic<int64_t> in_flight{0};
  std::atomic<uint64_t> requests{0};  // requests past the key check and the request bucket
  std::array<std::atomic<uint64_t>, kTenantRefusalCount> refusals{};
  std::atomic<uint64_t> prompt_tokens{0}, output_tokens{0};  // from the nodes' usage

  // Applies `limits` (buckets keep their tokens, capped by the new capacities).
  void apply(const config::Topology::TenantLimits& limits, Clock::time_point now);
  // The request bucket: true when a request may go (or there is no limit); else *wait_seconds.
  bool take_request(Clock::time_point now, double* wait_seconds);
  // The token bucket (see TenantTicket).
  bool take_tokens(double n, Clock::time_point now, double* wait_seconds);
  void settle_tokens(double reserved, double used, Clock::time_point now);
  void refuse(TenantRefusal why) { refusals[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  TokenBucket requests_bucket_, tokens_bucket_;
};

// One configuration's tenants, by name.
class TenantTable {
 public:
  // The state of `name`: its own when known, else "other"'s. Never null.
  const std::shared_ptr<TenantState>& resolve(std::string_view name) const;
  const std::shared_ptr<TenantState>& default_tenant() const { return default_; }  // resolve("default")
  const std::vector<std::pair<std::string, std::shared_ptr<TenantState>>>& all() const { return by_name_; }

 private:
  friend class TenantRegistry;
  std::vector<std::pair<std::string, std::shared_ptr<TenantState>>> by_name_;  // sorted; "other" included
  std::shared_ptr<TenantState> other_;
  std::shared_ptr<TenantState> default_;
};

class TenantRegistry {
 public:
  TenantRegistry();
  // The table of `topology`: built (reusing the states of tenants that remain, with the new
  // limits applied) the first time it is asked for, else the one already built. Any thread.
  std::shared_ptr<const TenantTable> table_for(const std::shared_ptr<const config::Topology>& topology);
  // The table last built (for /metrics).
  std::shared_ptr<const TenantTable> current() const;

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const config::Topology> applied_;
  std::shared_ptr<const TenantTable> table_;
};

// One request's hold on its tenant: an in-flight slot (max_in_flight) and the tokens it reserved
// (tokens_per_minute). Given back when released (end of the request) or destroyed. Movable.
class TenantTicket {
 public:
  TenantTicket() = default;
  TenantTicket(TenantTicket&& other) noexcept { *this = std::move(other); }
  TenantTicket& operator=(TenantTicket&& other) noexcept;
  TenantTicket(const TenantTicket&) = delete;
  TenantTicket& operator=(const TenantTicket&) = delete;
  ~TenantTicket() { release(); }

  // Takes an in-flight slot of `tenant`: false (and counted as kInFlight) when max_in_flight are
  // already running. Null tenant: an empty ticket, true.
  static bool acquire(std::shared_ptr<TenantState> tenant, TenantTicket* out);

  explicit operator bool() const { return tenant_ != nullptr; }
  const std::shared_ptr<TenantState>& tenant() const { return tenant_; }
  // True when the tenant has a tokens_per_minute limit (the request then reserves and settles).
  bool limits_tokens() const { return tenant_ && tenant_->tokens_per_minute.load(std::memory_order_relaxed) != 0; }

  // Reserves `tokens` of the tenant's tokens_per_minute (no limit: nothing to reserve, true).
  // False: refused (counted), *why and *wait_seconds (infinite for kTooLarge) say why and how long.
  bool reserve(uint64_t tokens, TenantState::Clock::time_point now, TenantRefusal* why, double* wait_seconds);
  // The request ended. `usage`: what the node reported (prompt and output tokens, either may be
  // missing); `upstream_work`: a node ran the request (false: refused or failed before any leg,
  // the reservation is given back whole). With both counts known the bucket is set to what was
  // really used; without them the reservation stands (a stream without usage: what it used is
  // not known). The counts known are added to the tenant's token counters. Then release().
  void finish(const proto::TokenUsage& usage, bool upstream_work);
  // Gives the in-flight slot back; the reservation stands. Later calls do nothing.
  void release();

 private:
  std::shared_ptr<TenantState> tenant_;
  uint64_t reserved_ = 0;
  bool holds_slot_ = false;
};

// pdrouter_tenant_* families of `table` (null: none).
void write_tenant_metrics(MetricsWriter& out, const TenantTable* table);

}  // namespace pdr::router::clients
