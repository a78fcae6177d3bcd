#include "bench/loadgen/resolve_host.h"

#include <netdb.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include "router/http/host_resolver.h"

namespace pdr::loadgen {

Status resolve_host(proto::HostPort* target) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* found = nullptr;
  if (getaddrinfo(target->host.c_str(), nullptr, &hints, &found) == 0) {
    freeaddrinfo(found);
    return {};
  }
  hints.ai_flags = 0;
  if (const int rc = getaddrinfo(target->host.c_str(), nullptr, &hints, &found); rc != 0) {
    return {StatusCode::kBadAddress,
            fmt::format("cannot resolve '{}': {}", target->host, gai_strerror(rc))};
  }
  // IPv4 first, as pdrouter's own upstream client: "localhost" often lists ::1 first while
  // servers listen on 127.0.0.1 only.
  const addrinfo* preferred = http::preferred_address(found);
  const addrinfo* pick = preferred != nullptr ? preferred : found;
  char host[NI_MAXHOST];
  const int rc = getnameinfo(pick->ai_addr, pick->ai_addrlen, host, sizeof host, nullptr, 0,
                             NI_NUMERICHOST);
  freeaddrinfo(found);
  if (rc != 0) return {StatusCode::kBadAddress, fmt::format("cannot resolve '{}'", target->host)};
  target->host = host;
  return {};
}

}  // namespace pdr::loadgen
