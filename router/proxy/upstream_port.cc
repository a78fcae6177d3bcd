#include "router/proxy/upstream_port.h"

#include <utility>

namespace pdr::router::proxy {

UpstreamPort::CallPtr PoolUpstreamPort::start(const proto::HostPort& target, http::UpstreamRequest&& request,
                                              http::UpstreamTimeouts timeouts, http::UpstreamCallbacks&& callbacks) {
  return pool_.start(target, std::move(request), timeouts, std::move(callbacks));
}

}  // namespace pdr::router::proxy
