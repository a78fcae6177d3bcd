// Sidecar: what `pdnode register` runs beside an unmodified vLLM node. It registers the node with
// the routers only while the node's health endpoint answers 200:
//
//   waiting  --health 200-->  registered (NodeClient heartbeating every `interval`)
//   registered --health fails--> paused (no heartbeats, so the routers expire the node)
//   paused   --health 200-->  registered (heartbeats resume at once)
//   any      --stop()-->      goodbye sent (pdrouter format) and run() returns 0
//
// Health is probed every `health_interval` (measured from the start of one probe to the start of
// the next). Each transition is logged at info level.
//
// Threads: run() blocks the calling thread until stop(); stop() may be called from any other
// thread (e.g. the one that waits for SIGTERM) and wakes run() at once, even mid-wait. A probe in
// progress is not interrupted; it ends by its own deadline (health_timeout).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "discovery/sidecar/health_probe.h"
#include "discovery/sidecar/node_client.h"

namespace pdr::sidecar {

struct SidecarOptions {
  NodeClientOptions client;  // endpoints, registration, heartbeat interval
  HealthProbe health;        // what to probe
  std::chrono::milliseconds health_interval{1000};
};

class Sidecar {
 public:
  explicit Sidecar(SidecarOptions options);

  // Runs the state machine above until stop(). Returns the process exit code: 0 after a clean
  // stop, 1 when the heartbeat client could not start.
  int run();
  // Any thread; idempotent.
  void stop();

 private:
  enum class State { kWaitingForHealth, kRegistered, kPaused };

  void on_health(const HealthProbeResult& result);
  bool wait_until(std::chrono::steady_clock::time_point deadline);  // false once stopping
  void say_goodbye();

  SidecarOptions options_;
  NodeClient client_;
  State state_ = State::kWaitingForHealth;
  bool client_failed_ = false;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_requested_ = false;
};

}  // namespace pdr::sidecar
