#include "router/http/http_server.h"

#include <netinet/in.h>
#include "proto/base/log.h"
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "router/http/http_worker.h"

namespace pdr::http {

namespace {

// The workers' listeners set SO_REUSEPORT, with which a second process of the same user (a
// second pdrouter started by mistake, or anything else) binds the same port without an error
// and the kernel splits the connections between them. Binding once without SO_REUSEPORT first
// fails with EADDRINUSE if anything listens there, whatever its options. SO_REUSEADDR as libuv
// sets it: a restart must not fail on the previous run's TIME_WAIT connections.
Status probe_port_free(const std::string& host, uint16_t port) {
  if (port == 0) return Status::ok();  // ephemeral: the kernel picks a free port
  sockaddr_storage addr{};
  socklen_t len = sizeof(sockaddr_in);
  if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr)) != 0) {
    if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr)) != 0) {
      return Status(StatusCode::kBadAddress, "listen host is not an IPv4 or IPv6 literal: " + host);
    }
    len = sizeof(sockaddr_in6);
  }
  const int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kIoError, std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    return Status(StatusCode::kIoError,
                  "bind " + host + ":" + std::to_string(port) + ": " + std::strerror(err) +
                      (err == EADDRINUSE ? " (another process listens there)" : ""));
  }
  return Status::ok();
}

}  // namespace

struct Server::Impl {
  ServerShared shared;
  std::vector<std::unique_ptr<HttpWorker>> workers;  // fixed after start(); freed in ~Server
  uint16_t port = 0;
  std::mutex state_mu;
  bool started = false;
  bool running = false;
};

Server::Server() : impl_(std::make_unique<Impl>()) {}

Server::~Server() {
  stop(std::chrono::milliseconds(0));
  impl_->workers.clear();
}

Status Server::start(const ServerOptions& options, Handler handler) {
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  if (impl_->started) return Status(StatusCode::kRejected, "server already started");
  if (options.workers == 0 || options.workers > 1024) {
    return Status(StatusCode::kOutOfRange, "workers must be in [1, 1024]");
  }
  if (options.max_header_bytes == 0 || options.max_connections == 0) {
    return Status(StatusCode::kOutOfRange, "max_header_bytes and max_connections must be > 0");
  }
  if (!handler) return Status(StatusCode::kInvalidValue, "handler is empty");
  impl_->shared.options = options;
  impl_->shared.handler = std::move(handler);
  impl_->shared.tls.publish(options.tls);

  uint16_t port = options.port;
  if (Status s = probe_port_free(options.host, port); !s.is_ok()) return s;
  std::vector<std::unique_ptr<HttpWorker>> workers;
  for (uint32_t i = 0; i < options.workers; ++i) {
    auto w = std::make_unique<HttpWorker>(i, impl_->shared);
    Status s = w->listen(options.host, &port);
    if (!s.is_ok()) {
      workers.push_back(std::move(w));
      workers.clear();  // closes the listeners bound so far on this thread
      return s;
    }
    workers.push_back(std::move(w));
  }
  impl_->workers = std::move(workers);
  impl_->port = port;
  for (auto& w : impl_->workers) w->start_thread();
  impl_->started = true;
  impl_->running = true;
  pdr::log::info("http: listening on {}:{} with {} worker(s)", options.host, port, options.workers);
  return Status::ok();
}

uint16_t Server::port() const { return impl_->port; }

uint32_t Server::workers() const { return static_cast<uint32_t>(impl_->workers.size()); }

void Server::post(uint32_t worker, std::function<void()> fn) {
  if (worker >= impl_->workers.size()) return;
  impl_->workers[worker]->post(std::move(fn));
}

void Server::stop(std::chrono::milliseconds drain) {
  std::lock_guard<std::mutex> lock(impl_->state_mu);
  if (!impl_->running) return;
  for (auto& w : impl_->workers) {
    if (HttpWorker::current() == w.get()) {
      pdr::log::error("http: Server::stop called from its own worker thread; ignored");
      return;
    }
  }
  impl_->running = false;
  ServerShared& shared = impl_->shared;
  const auto deadline = std::chrono::steady_clock::now() + drain;
  shared.stopping.store(true);
  for (auto& w : impl_->workers) {
    HttpWorker* wp = w.get();
    wp->post([wp] { wp->begin_drain(); });
  }
  {
    std::unique_lock<std::mutex> l(shared.drain_mu);
    const bool drained = shared.drain_cv.wait_until(
        l, deadline, [&] { return shared.stats.connections_active.load() == 0; });
    if (!drained) {
      pdr::log::warn("http: drain deadline passed with {} connection(s) open; closing them",
                   shared.stats.connections_active.load());
    }
  }
  for (auto& w : impl_->workers) {
    HttpWorker* wp = w.get();
    wp->post([wp] { wp->shutdown(); });
  }
  for (auto& w : impl_->workers) w->join();
  pdr::log::info("http: server on port {} stopped", impl_->port);
}

const ServerStats& Server::stats() const { return impl_->shared.stats; }

void Server::set_tls(std::shared_ptr<const TlsServerContext> tls) {
  if (!tls || !impl_->shared.options.tls) return;
  impl_->shared.tls.publish(std::move(tls));
}

std::shared_ptr<const TlsServerContext> Server::tls() const { return impl_->shared.tls.load(); }

uv_loop_s* Server::loop(uint32_t worker) const {
  if (worker >= impl_->workers.size()) return nullptr;
  return impl_->workers[worker]->loop();
}

}  // namespace pdr::http
