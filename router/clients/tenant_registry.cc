// Tenants, their limits and tickets (contracts in tenant_registry.h).
#include "router/clients/tenant_registry.h"

#include <algorithm>
#include <limits>
#include <map>

#include "proto/base/metrics_writer.h"

namespace pdr::router::clients {

std::string_view to_string(TenantRefusal why) {
  switch (why) {
    case TenantRefusal::kRequestsPerSecond: return "requests_per_second";
    case TenantRefusal::kTokensPerMinute: return "tokens_per_minute";
    case TenantRefusal::kTooLarge: return "too_large";
    case TenantRefusal::kInFlight: return "in_flight";
  }
  return "unknown";
}

void TenantState::apply(const config::Topology::TenantLimits& limits, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const double burst = limits.burst != 0 ? limits.burst : std::max<uint32_t>(1, limits.requests_per_second);
  if (limits.requests_per_second != 0 && requests_per_second.load(std::memory_order_relaxed) == 0) {
    requests_bucket_ = TokenBucket(burst, limits.requests_per_second, now);  // a new limit starts full
  } else {
    requests_bucket_.reconfigure(burst, limits.requests_per_second, now);
  }
  const double per_minute = limits.tokens_per_minute;
  if (limits.tokens_per_minute != 0 && tokens_per_minute.load(std::memory_order_relaxed) == 0) {
    tokens_bucket_ = TokenBucket(per_minute, per_minute / 60.0, now);
  } else {
    tokens_bucket_.reconfigure(per_minute, per_minute / 60.0, now);
  }
  requests_per_second.store(limits.requests_per_second, std::memory_order_relaxed);
  tokens_per_minute.store(limits.tokens_per_minute, std::memory_order_relaxed);
  max_in_flight.store(limits.max_in_flight, std::memory_order_relaxed);
  priority.store(limits.priority, std::memory_order_relaxed);
}

bool TenantState::take_request(Clock::time_point now, double* wait_seconds) {
  if (requests_per_second.load(std::memory_order_relaxed) == 0) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return requests_bucket_.try_take(1, now, wait_seconds);
}

bool TenantState::take_tokens(double n, Clock::time_point now, double* wait_seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  return tokens_bucket_.try_take(n, now, wait_seconds);
}

void TenantState::settle_tokens(double reserved, double used, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used < reserved) {
    tokens_bucket_.put_back(reserved - used, now);
  } else if (used > reserved) {
    tokens_bucket_.charge(used - reserved, now);  // a debt the next refills pay
  }
}

const std::shared_ptr<TenantState>& TenantTable::resolve(std::string_view name) const {
  auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                             [](const auto& entry, std::string_view n) { return entry.first < n; });
  if (it != by_name_.end() && it->first == name) return it->second;
  return other_;
}

TenantRegistry::TenantRegistry() {
  auto table = std::make_shared<TenantTable>();
  table->other_ = std::make_shared<TenantState>(std::string(config::kOtherTenant));
  table->default_ = std::make_shared<TenantState>(std::string(config::kDefaultTenant));
  table->by_name_.emplace_back(std::string(config::kDefaultTenant), table->default_);
  table->by_name_.emplace_back(std::string(config::kOtherTenant), table->other_);
  table_ = std::move(table);
}

std::shared_ptr<const TenantTable> TenantRegistry::table_for(const std::shared_ptr<const config::Topology>& topology) {
  std::lock_guard<std::mutex> lock(mu_);
  if (topology == applied_ && table_) return table_;
  // Every tenant the configuration names, each with its limits; states carried over by name.
  std::map<std::string_view, const config::Topology::TenantLimits*> named;
  const config::Topology::Tenants& tenants = topology->tenants;
  named.emplace(config::kDefaultTenant, &tenants.limits_of(config::kDefaultTenant));
  named.emplace(config::kOtherTenant, &tenants.defaults);
  for (const std::string& name : topology->client_auth.keys.tenants) named.emplace(name, &tenants.limits_of(name));
  for (const auto& [name, limits] : tenants.limits) named.emplace(name, &limits);
  auto table = std::make_shared<TenantTable>();
  table->by_name_.reserve(named.size());
  const auto now = TenantState::Clock::now();
  for (const auto& [name, limits] : named) {
    std::shared_ptr<TenantState> state;
    if (table_) {
      if (name == config::kOtherTenant) {
        state = table_->other_;
      } else if (const auto& old = table_->resolve(name); old->name == name) {
        state = old;
      }
    }
    if (!state) state = std::make_shared<TenantState>(std::string(name));
    state->apply(*limits, now);
    if (name == config::kOtherTenant) table->other_ = state;
    if (name == config::kDefaultTenant) table->default_ = state;
    table->by_name_.emplace_back(std::string(name), std::move(state));
  }
  applied_ = topology;
  table_ = std::move(table);
  return table_;
}

std::shared_ptr<const TenantTable> TenantRegistry::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_;
}

TenantTicket& TenantTicket::operator=(TenantTicket&& other) noexcept {
  if (this != &other) {
    release();
    tenant_ = std::move(other.tenant_);
    reserved_ = std::exchange(other.reserved_, 0);
    holds_slot_ = std::exchange(other.holds_slot_, false);
  }
  return *this;
}

bool TenantTicket::acquire(std::shared_ptr<TenantState> tenant, TenantTicket* out) {
  out->release();
  out->reserved_ = 0;
  out->tenant_.reset();
  if (!tenant) return true;
  const uint32_t cap = tenant->max_in_flight.load(std::memory_order_relaxed);
  const int64_t before = tenant->in_flight.fetch_add(1, std::memory_order_relaxed);
  if (cap != 0 && before >= static_cast<int64_t>(cap)) {
    tenant->in_flight.fetch_sub(1, std::memory_order_relaxed);
    tenant->refuse(TenantRefusal::kInFlight);
    return false;
  }
  out->tenant_ = std::move(tenant);
  out->holds_slot_ = true;
  return true;
}

bool TenantTicket::reserve(uint64_t tokens, TenantState::Clock::time_point now, TenantRefusal* why,
                           double* wait_seconds) {
  if (!limits_tokens()) return true;
  const uint32_t per_minute = tenant_->tokens_per_minute.load(std::memory_order_relaxed);
  if (tokens > per_minute) {
    *why = TenantRefusal::kTooLarge;
    *wait_seconds = std::numeric_limits<double>::infinity();
    tenant_->refuse(*why);
    return false;
  }
  if (!tenant_->take_tokens(static_cast<double>(tokens), now, wait_seconds)) {
    *why = TenantRefusal::kTokensPerMinute;
    tenant_->refuse(*why);
    return false;
  }
  reserved_ += tokens;
  return true;
}

void TenantTicket::finish(const proto::TokenUsage& usage, bool upstream_work) {
  if (!tenant_) return;
  const auto now = reserved_ != 0 ? TenantState::Clock::now() : TenantState::Clock::time_point{};
  if (usage.prompt_tokens) tenant_->prompt_tokens.fetch_add(*usage.prompt_tokens, std::memory_order_relaxed);
  if (usage.output_tokens) tenant_->output_tokens.fetch_add(*usage.output_tokens, std::memory_order_relaxed);
  if (reserved_ != 0) {
    if (!upstream_work) {
      tenant_->settle_tokens(static_cast<double>(reserved_), 0, now);
    } else if (usage.prompt_tokens && usage.output_tokens) {
      tenant_->settle_tokens(static_cast<double>(reserved_),
                             static_cast<double>(*usage.prompt_tokens + *usage.output_tokens), now);
    }
    reserved_ = 0;
  }
  release();
}

void TenantTicket::release() {
  if (holds_slot_) {
    tenant_->in_flight.fetch_sub(1, std::memory_order_relaxed);
    holds_slot_ = false;
  }
}

void write_tenant_metrics(MetricsWriter& out, const TenantTable* table) {
  if (table == nullptr) return;
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  for (const auto& [name, state] : table->all()) {
    out.counter("pdrouter_tenant_requests_total",
                "Client requests past the key check and the tenant's request rate, by tenant (tenants nobody "
                "names count as other)",
                v(state->requests), {{"tenant", name}});
  }
  for (const auto& [name, state] : table->all()) {
    for (size_t r = 0; r < kTenantRefusalCount; ++r) {
      out.counter("pdrouter_tenant_refusals_total", "Client requests refused 429 by a tenant limit, by tenant and reason",
                  v(state->refusals[r]),
                  {{"tenant", name}, {"reason", std::string(to_string(static_cast<TenantRefusal>(r)))}});
    }
  }
  for (const auto& [name, state] : table->all()) {
    out.gauge("pdrouter_tenant_in_flight", "P/D and one-node requests of the tenant running now",
              static_cast<double>(state->in_flight.load(std::memory_order_relaxed)), {{"tenant", name}});
  }
  for (const auto& [name, state] : table->all()) {
    out.counter("pdrouter_tenant_tokens_total", "Tokens the nodes reported in their answers' usage, by tenant and type",
                v(state->prompt_tokens), {{"tenant", name}, {"type", "prompt"}});
    out.counter("pdrouter_tenant_tokens_total", "Tokens the nodes reported in their answers' usage, by tenant and type",
                v(state->output_tokens), {{"tenant", name}, {"type", "output"}});
  }
}

}  // namespace pdr::router::clients
