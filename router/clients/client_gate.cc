// The client key check and the tenant's request rate (contracts in client_gate.h).
#include "router/clients/client_gate.h"

#include "proto/base/ascii.h"
#include "proto/base/metrics_writer.h"

namespace pdr::router::clients {

namespace {

// Neither the reply nor the log says whether the key was missing or wrong, nor anything of it.
constexpr std::string_view kUnauthorized =
    "a valid API key is required: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::string_view bearer_token(std::string_view authorization) {
  authorization = trim(authorization);
  constexpr std::string_view kBearer = "bearer";
  if (authorization.size() <= kBearer.size() || !pdr::iequals(authorization.substr(0, kBearer.size()), kBearer) ||
      (authorization[kBearer.size()] != ' ' && authorization[kBearer.size()] != '\t')) {
    return {};
  }
  return trim(authorization.substr(kBearer.size()));
}

GateVerdict ClientGate::admit(const http::Request& request, const config::Topology& topology,
                              const TenantTable& tenants, ClientIdentity* identity) {
  const config::Topology::ClientAuth& auth = topology.client_auth;
  identity->forward_credential = !auth.enabled() || auth.forward_client_key;
  if (auth.enabled()) {
    const auto authorization = request.header("Authorization");
    const std::string_view bearer = bearer_token(authorization.value_or(std::string_view()));
    const std::string_view api_key = trim(request.header("x-api-key").value_or(std::string_view()));
    const std::string* tenant = bearer.empty() ? nullptr : auth.keys.find(bearer);
    if (tenant == nullptr && !api_key.empty()) tenant = auth.keys.find(api_key);
    if (tenant == nullptr) {
      const std::string_view address = AdminThrottle::address_of(request.peer);
      const auto now = AdminThrottle::Clock::now();
      if (const auto scope = throttle_.throttled(address, now); scope != AdminThrottle::Scope::kNone) {
        counters_.throttled.fetch_add(1, std::memory_order_relaxed);
        return {false, 429,
                "too many failed authentications from " + std::string(AdminThrottle::describe(scope)) +
                    "; retry later",
                "rate_limit_error", "auth_throttled", 1};
      }
      throttle_.failed(address, now);
      (!authorization && api_key.empty() ? counters_.missing_key : counters_.invalid_key)
          .fetch_add(1, std::memory_order_relaxed);
      return {false, 401, std::string(kUnauthorized), "invalid_request_error", "invalid_api_key", 0};
    }
    identity->name = *tenant;
    identity->tenant = tenants.resolve(identity->name);
  } else if (!topology.tenants.header.empty()) {
    const auto value = request.header(topology.tenants.header);
    if (!value || value->empty()) {
      identity->name = config::kDefaultTenant;
    } else if (config::is_tenant_name(*value)) {
      identity->name = *value;
    } else {
      identity->name = config::kOtherTenant;
    }
    identity->tenant = tenants.resolve(identity->name);
  } else {
    identity->name = config::kDefaultTenant;
    identity->tenant = tenants.default_tenant();
  }
  TenantState& state = *identity->tenant;
  double wait = 0;
  if (!state.take_request(TenantState::Clock::now(), &wait)) {
    state.refuse(TenantRefusal::kRequestsPerSecond);
    return {false, 429,
            "tenant '" + identity->name + "' is over its request rate (tenants: requests_per_second = " +
                std::to_string(state.requests_per_second.load(std::memory_order_relaxed)) + ")",
            "requests", "rate_limit_exceeded", TokenBucket::retry_after_seconds(wait)};
  }
  state.requests.fetch_add(1, std::memory_order_relaxed);
  return {};
}

void write_client_metrics(MetricsWriter& out, const ClientGate* gate) {
  const ClientGate::Counters zero;
  const ClientGate::Counters& c = gate != nullptr ? gate->counters() : zero;
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_client_auth_failures_total",
              "Client requests refused 401 by the key check (client_auth.keys_file), by reason: missing (no key "
              "sent) or invalid (no key of the file)",
              v(c.missing_key), {{"reason", "missing"}});
  out.counter("pdrouter_client_auth_failures_total",
              "Client requests refused 401 by the key check (client_auth.keys_file), by reason: missing (no key "
              "sent) or invalid (no key of the file)",
              v(c.invalid_key), {{"reason", "invalid"}});
  out.counter("pdrouter_client_auth_throttled_total",
              "Client requests with a wrong key answered 429 because their address, network or all clients failed "
              "too often",
              v(c.throttled));
  if (gate != nullptr) write_tenant_metrics(out, gate->tenants().current().get());
}

}  // namespace pdr::router::clients
