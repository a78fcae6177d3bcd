// HostResolver: turns an upstream's hostname into an address for the loop's connects, without
// blocking the loop (uv_getaddrinfo runs on libuv's thread pool).
//
// Nodes usually register IP literals, but operators write hostnames in topology files (Kubernetes
// service or pod DNS names, /etc/hosts entries). Those are resolved here, once per name per
// `ttl`: getaddrinfo reports no DNS TTL, so a fixed one bounds how long a moved node is called at
// its old address. Concurrent lookups of one name share one getaddrinfo; failures are not cached.
// IPv4 addresses are preferred over IPv6 ones (vLLM's default --host 0.0.0.0 listens on IPv4
// only, while "localhost" often resolves to ::1 first); a caller whose connect to the chosen
// address fails calls forget() so the next call looks the name up again.
//
// Threading: everything runs on the loop's thread, and callbacks fire there, never inside
// resolve(). close() fails the waiting lookups (kIoError, "resolver closed") at once; lookups
// still on the thread pool then finish into nothing. The loop must run until those finish (uv_loop_alive), as for
// every other handle.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "proto/base/status.h"

struct uv_loop_s;
struct addrinfo;

namespace pdr::http {

// The address a getaddrinfo answer is used at: its first IPv4 entry, else its first IPv6 one,
// else nullptr (see above for why IPv4 first). Also what pdrouter-bench resolves its target to.
const addrinfo* preferred_address(const addrinfo* list);

struct ResolverStats {
  uint64_t lookups = 0;   // getaddrinfo calls started
  uint64_t hits = 0;      // answers from the cache
  uint64_t failures = 0;  // lookups that failed or timed out
};

class HostResolver {
 public:
  // error is ok and address holds the host's address with port 0 (the caller sets its port), or
  // error says why not (kNotFound: no such name or no address; kIoError: timeout, closed, other).
  using Callback = std::function<void(const Status& error, const sockaddr_storage& address)>;

  HostResolver(uv_loop_s* loop, std::chrono::milliseconds ttl, std::chrono::milliseconds timeout);
  ~HostResolver();  // close()
  HostResolver(const HostResolver&) = delete;
  HostResolver& operator=(const HostResolver&) = delete;

  // The cached address of `host`, if a lookup within the last `ttl` found one.
  bool cached(const std::string& host, sockaddr_storage* address);
  // Looks `host` up (a DNS name; IP literals need no resolver) and calls `done` from the loop,
  // once. An error return (closed, or libuv refused the lookup) means `done` is never called.
  Status resolve(const std::string& host, Callback done);
  // Drops `host` from the cache: the next resolve() asks the system again.
  void forget(const std::string& host);
  void close();

  ResolverStats stats() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace pdr::http
