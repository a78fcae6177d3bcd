#include "router/http/host_resolver.h"

#include <netdb.h>
#include <uv.h>

#include <cstring>
#include <unordered_map>
#include <utility>
#include <vector>

#include "router/http/uv_handle.h"

namespace pdr::http {

namespace {

struct CacheEntry {
  sockaddr_storage address{};
  uint64_t expires_ms = 0;  // uv_now() scale
};

bool pick_address(const addrinfo* list, sockaddr_storage* out) {
  const addrinfo* chosen = preferred_address(list);
  if (chosen == nullptr || chosen->ai_addrlen > sizeof(sockaddr_storage)) return false;
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, chosen->ai_addr, chosen->ai_addrlen);
  return true;
}

Status lookup_error(const std::string& host, int status, bool found) {
  if (status == 0 && found) return Status::ok();
  const std::string what = "cannot resolve '" + host + "': ";
  if (status == 0) return Status(StatusCode::kNotFound, what + "no IPv4 or IPv6 address");
  if (status == UV_EAI_NONAME || status == UV_EAI_NODATA) {
    return Status(StatusCode::kNotFound, what + uv_strerror(status));
  }
  return Status(StatusCode::kIoError, what + uv_strerror(status));
}

}  // namespace

const addrinfo* preferred_address(const addrinfo* list) {
  const addrinfo* chosen = nullptr;
  for (const addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) return ai;
    if (ai->ai_family == AF_INET6 && chosen == nullptr) chosen = ai;
  }
  return chosen;
}

struct HostResolver::State {
  // One getaddrinfo on the thread pool. Freed when it finishes (on_resolved runs exactly once,
  // also after uv_cancel); its waiters may have been answered before that (timeout, close).
  struct Lookup {
    uv_getaddrinfo_t req{};
    detail::UvHandle<uv_timer_t> timer;  // the lookup's timeout
    std::weak_ptr<State> state;
    std::string host;
    std::vector<Callback> waiters;
    bool settled = false;
  };

  uv_loop_t* loop = nullptr;
  uint64_t ttl_ms = 0;
  uint64_t timeout_ms = 0;
  bool closed = false;
  ResolverStats stats;
  std::unordered_map<std::string, CacheEntry> cache;
  std::unordered_map<std::string, Lookup*> in_flight;  // the lookup new waiters of a name join

  // Answers `lookup`'s waiters once; it stops being the lookup new waiters join.
  void settle(Lookup* lookup, const Status& error, const sockaddr_storage& address) {
    if (lookup->settled) return;
    lookup->settled = true;
    if (auto it = in_flight.find(lookup->host); it != in_flight.end() && it->second == lookup) {
      in_flight.erase(it);
    }
    lookup->timer.close();
    if (!error) ++stats.failures;
    std::vector<Callback> waiters = std::move(lookup->waiters);
    for (Callback& done : waiters) done(error, address);
  }

  static void on_resolved(uv_getaddrinfo_t* req, int status, addrinfo* result) {
    std::unique_ptr<Lookup> lookup(static_cast<Lookup*>(req->data));
    sockaddr_storage address{};
    const bool found = status == 0 && pick_address(result, &address);
    if (result != nullptr) uv_freeaddrinfo(result);
    std::shared_ptr<State> self = lookup->state.lock();
    if (!self || self->closed) return;
    // Cached even when the lookup timed out: the next call to that name connects at once.
    if (found) self->cache[lookup->host] = {address, uv_now(self->loop) + self->ttl_ms};
    self->settle(lookup.get(), lookup_error(lookup->host, status, found), address);
  }

  static void on_timeout(uv_timer_t* timer) {
    auto* lookup = detail::UvHandle<uv_timer_t>::owner_of<Lookup>(timer);
    std::shared_ptr<State> self = lookup->state.lock();
    if (!self) return;
    self->settle(lookup,
                 Status(StatusCode::kIoError, "cannot resolve '" + lookup->host +
                                                  "': no answer within " +
                                                  std::to_string(self->timeout_ms) + " ms"),
                 sockaddr_storage{});
  }
};

HostResolver::HostResolver(uv_loop_s* loop, std::chrono::milliseconds ttl, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  state_->loop = loop;
  state_->ttl_ms = ttl.count() > 0 ? static_cast<uint64_t>(ttl.count()) : 0;
  state_->timeout_ms = timeout.count() > 0 ? static_cast<uint64_t>(timeout.count()) : 0;
}

HostResolver::~HostResolver() { close(); }

bool HostResolver::cached(const std::string& host, sockaddr_storage* address) {
  auto it = state_->cache.find(host);
  if (it == state_->cache.end()) return false;
  if (uv_now(state_->loop) >= it->second.expires_ms) {
    state_->cache.erase(it);
    return false;
  }
  *address = it->second.address;
  ++state_->stats.hits;
  return true;
}

Status HostResolver::resolve(const std::string& host, Callback done) {
  State& s = *state_;
  if (s.closed) return Status(StatusCode::kIoError, "resolver closed");
  if (auto it = s.in_flight.find(host); it != s.in_flight.end()) {
    it->second->waiters.push_back(std::move(done));
    return Status::ok();
  }
  auto lookup = std::make_unique<State::Lookup>();
  lookup->state = state_;
  lookup->host = host;
  lookup->req.data = lookup.get();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const int rc = uv_getaddrinfo(s.loop, &lookup->req, &State::on_resolved, host.c_str(), nullptr, &hints);
  if (rc < 0) {
    ++s.stats.failures;
    return Status(StatusCode::kIoError, "cannot resolve '" + host + "': " + uv_strerror(rc));
  }
  ++s.stats.lookups;
  State::Lookup* raw = lookup.release();  // on_resolved frees it
  raw->waiters.push_back(std::move(done));
  s.in_flight[host] = raw;
  if (s.timeout_ms > 0 &&
      raw->timer.init(raw, [&](uv_timer_t* t) { return uv_timer_init(s.loop, t); }) == 0) {
    uv_timer_start(raw->timer.get(), &State::on_timeout, s.timeout_ms, 0);
  }
  return Status::ok();
}

void HostResolver::forget(const std::string& host) { state_->cache.erase(host); }

void HostResolver::close() {
  State& s = *state_;
  if (s.closed) return;
  s.closed = true;
  std::unordered_map<std::string, State::Lookup*> in_flight = std::move(s.in_flight);
  s.in_flight.clear();
  for (auto& [host, lookup] : in_flight) {
    uv_cancel(reinterpret_cast<uv_req_t*>(&lookup->req));  // not started yet: finishes sooner
    s.settle(lookup, Status(StatusCode::kIoError, "resolver closed"), sockaddr_storage{});
  }
}

ResolverStats HostResolver::stats() const { return state_->stats; }

}  // namespace pdr::http
