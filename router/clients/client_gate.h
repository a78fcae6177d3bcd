// ClientGate: the check in front of every client endpoint but /health and /ready (the route
// table's Guard::kClientKey; unknown paths relayed by routing.pass_through_unknown too).
//
// With client_auth.keys_file (discovery/config/client_key_file.h), a request must present one of the
// file's keys, as `Authorization: Bearer <key>` or as `x-api-key: <key>` (Anthropic's SDKs send
// that); either header may hold it (an OpenAI SDK always sends Authorization, often
// "Bearer EMPTY", so both are tried). Otherwise: 401, the same answer whether a key was missing
// or wrong (the counters tell them apart). Failures are throttled as the admin key's are
// (router/clients/admin_throttle.h: per address, network and all clients; a right key always passes):
// a wrong key from a throttled source is 429 auth_throttled with Retry-After: 1.
//
// Then the request's tenant (tenant_registry.h) and its request bucket (requests_per_second): an
// empty bucket is 429 with Retry-After, the seconds until the bucket holds a request again.
//
// Whether the client's credential may go on to the nodes is decided here too: without client
// keys it does (as before keys existed); with keys only when client_auth.forward_client_key is
// set: a client's key for pdrouter is not a key for the nodes, and a node (or whoever runs one)
// must not learn it.
//
// Worker threads; the counters are relaxed atomics, the throttle has its own mutex (taken only
// on a failure).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"
#include "router/http/http_message.h"
#include "router/clients/admin_throttle.h"
#include "router/clients/tenant_registry.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::clients {

// Who a request that passed the gate is for.
struct ClientIdentity {
  std::shared_ptr<TenantState> tenant;  // never null once admitted
  // The tenant's name: a known tenant's, or a tenant header's value that names no known tenant
  // (limited and counted as "other", logged as sent), or "other" for a value that is not a name.
  std::string name;
  bool forward_credential = true;  // the client's Authorization / x-api-key may reach the nodes
};

// What the gate decided. Not ok: the caller answers `status` with `message`, `type` and `code`
// (OpenAI's error shape, or Anthropic's on its paths), plus Retry-After `retry_after` (seconds;
// 0: none) and for a 401 WWW-Authenticate.
struct GateVerdict {
  bool ok = true;
  int status = 200;
  std::string message;
  std::string_view type, code;
  long retry_after = 0;
};

class ClientGate {
 public:
  struct Counters {
    std::atomic<uint64_t> missing_key{0};  // no credential in either header
    std::atomic<uint64_t> invalid_key{0};  // a credential that is no key of the file
    std::atomic<uint64_t> throttled{0};    // wrong keys answered 429 (auth_throttled)
  };

  // `tenants`: the table of `topology` (TenantRegistry::table_for).
  GateVerdict admit(const http::Request& request, const config::Topology& topology, const TenantTable& tenants,
                    ClientIdentity* identity);

  TenantRegistry& tenants() { return tenants_; }
  const TenantRegistry& tenants() const { return tenants_; }
  const Counters& counters() const { return counters_; }

 private:
  AdminThrottle throttle_;
  Counters counters_;
  TenantRegistry tenants_;
};

// The key a header carries: `Authorization: Bearer <key>` (scheme in any case), or the whole
// x-api-key value; "" for none.
std::string_view bearer_token(std::string_view authorization);

// pdrouter_client_auth_* and pdrouter_tenant_* families (null: none).
void write_client_metrics(MetricsWriter& out, const ClientGate* gate);

}  // namespace pdr::router::clients
