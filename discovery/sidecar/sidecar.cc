#include "discovery/sidecar/sidecar.h"

#include <algorithm>
#include <utility>

#include "proto/base/log.h"

namespace pdr::sidecar {

Sidecar::Sidecar(SidecarOptions options)
    : options_(std::move(options)), client_(options_.client) {}

int Sidecar::run() {
  pdr::log::info("waiting for {} to answer 200 before registering", options_.health.url());
  auto next_probe = std::chrono::steady_clock::now();
  while (true) {
    next_probe += options_.health_interval;
    on_health(options_.health.probe());
    if (client_failed_) break;
    // A probe that overran its slot starts the next one now rather than bursting.
    next_probe = std::max(next_probe, std::chrono::steady_clock::now());
    if (!wait_until(next_probe)) break;
  }
  say_goodbye();
  return client_failed_ ? 1 : 0;
}

void Sidecar::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_requested_ = true;
  }
  wake_.notify_all();
}

void Sidecar::on_health(const HealthProbeResult& result) {
  const bool healthy = result.healthy();
  switch (state_) {
    case State::kWaitingForHealth:
      if (!healthy) {
        pdr::log::debug("target not healthy yet ({})", result.describe());
        return;
      }
      if (Status s = client_.start(); !s.is_ok()) {
        pdr::log::error("cannot start heartbeats: {}", s.to_string());
        client_failed_ = true;
        return;
      }
      pdr::log::info("target healthy, registering with {} routers",
                   options_.client.router_endpoints.size());
      state_ = State::kRegistered;
      return;
    case State::kRegistered:
      if (healthy) return;
      client_.pause();
      pdr::log::info("health failed ({}), pausing heartbeats", result.describe());
      state_ = State::kPaused;
      return;
    case State::kPaused:
      if (!healthy) return;
      client_.resume();
      pdr::log::info("target healthy again, resuming heartbeats");
      state_ = State::kRegistered;
      return;
  }
}

bool Sidecar::wait_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  return !wake_.wait_until(lock, deadline, [this] { return stop_requested_; });
}

void Sidecar::say_goodbye() {
  if (state_ == State::kWaitingForHealth) {
    pdr::log::info("stopping before registration; nothing to say goodbye to");
    return;
  }
  client_.stop(/*send_goodbye=*/true);
  const NodeClientStats stats = client_.stats();
  if (options_.client.registration.format == proto::RegistrationFormat::kPdrouter) {
    pdr::log::info("goodbye sent to {} of {} routers", stats.goodbyes_sent,
                 options_.client.router_endpoints.size());
  } else {
    pdr::log::info("heartbeats stopped ({} format has no goodbye message)",
                 proto::to_string(options_.client.registration.format));
  }
}

}  // namespace pdr::sidecar
