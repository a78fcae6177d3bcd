// DiscoveryService: the ZMQ ROUTER listener thread that turns node heartbeats into registry
// snapshots.
//
// Threads: start()/stop()/apply_topology()/post() may be called from any thread. Everything else
// (the socket, the Registry) lives on the service's own thread; other threads reach it only by
// post(), which queues a closure and wakes the thread through an eventfd.
//
// Admission (discovery/config/admission.h): each connection passes the ZAP policy at its handshake (the
// service answers libzmq's ZAP requests on its own thread), each message gets the admission class
// of its connection (raised to kToken by a valid auth token), and a registration or goodbye that
// names an address other than the sender's own is refused unless the sender authenticated: its
// http_address, zmq_address host and KV events endpoints (the router connects to them, or hands
// them to the paired node); a host name counts as another address (discovery/config/admission.h).
//
// Each accepted frame pair [identity, payload] is decoded (proto/), authenticated, applied to the
// registry, and, for messages carrying `pdr_v`, acknowledged to the sender. Anything else is
// counted by reason and logged at a limited rate; it never changes the registry. A changed
// registry is published once per receive batch, before that batch's acks go out. Heartbeats that
// only refresh liveness publish nothing: snapshots share each node's live InstanceLiveness cell.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "discovery/discovery_counters.h"
#include "discovery/instance.h"
#include "discovery/registry.h"
#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology.h"
#include "discovery/zap_policy.h"
#include "proto/discovery_message.h"
#include "proto/base/status.h"

namespace pdr::discovery {

struct DiscoveryServiceOptions {
  std::string bind_endpoint = "tcp://*:36367";  // "tcp://host:0" means an ephemeral port
  // The CURVE endpoint ("" = none) and its server keys. Like bind_endpoint, fixed at start().
  std::string curve_endpoint;
  proto::CurveKeyPair curve_keys;
  // Handshake admission for both endpoints (allowed peers, allowed CURVE client keys). The
  // default admits loopback peers only.
  ZapPolicy zap{config::loopback_allow_list(), {}, false};
  RegistryOptions registry;
  proto::DecodeLimits limits;
  std::string auth_token;                        // "" = no authentication
  bool allow_unauthenticated_vllm = true;
  std::vector<config::StaticInstance> static_instances;
  // Frames above this are dropped by libzmq itself (the peer is disconnected) before they are
  // buffered; frames between limits.max_message_bytes and this are read and counted too_large.
  int64_t hard_frame_limit = 1024 * 1024;
  // After a wake that found few messages, wait this long before reading the socket again so the
  // next wake takes a batch (CPU at 10k nodes vs at most this much added latency). 0 disables.
  std::chrono::milliseconds batch_window{2};

  static DiscoveryServiceOptions from(const config::Topology& topology);
};

class DiscoveryService {
 public:
  DiscoveryService(SnapshotCell<RegistrySnapshot>& snapshots, DiscoveryCounters& counters);
  ~DiscoveryService();  // stops the thread if running
  DiscoveryService(const DiscoveryService&) = delete;
  DiscoveryService& operator=(const DiscoveryService&) = delete;

  // Binds synchronously (so a bad endpoint or a port in use is reported here), publishes the
  // first snapshot (static instances), then starts the thread.
  Status start(const DiscoveryServiceOptions& options);
  // The endpoints actually bound, e.g. "tcp://127.0.0.1:40321" (valid after start());
  // bound_curve_endpoint() is "" without a CURVE endpoint.
  std::string bound_endpoint() const;
  std::string bound_curve_endpoint() const;

  // Applies a reloaded topology: TTL bounds, limits, authentication and static instances. The
  // bind endpoint cannot change live (the caller logs that a restart is needed).
  void apply_topology(const config::Topology& topology);
  // Runs `fn` on the discovery thread with the registry; a snapshot follows if it changed anything.
  // `on_published`, if given, then runs on the discovery thread once that snapshot is published
  // (right after `fn` when nothing changed), so whoever it notifies reads the change from the
  // SnapshotCell. Neither runs if the service stops first; both are then destroyed with it.
  // Closures must not block: they hold up every node's heartbeats.
  void post(std::function<void(Registry&)> fn, std::function<void()> on_published = {});
  // Stops and joins the thread; idempotent.
  void stop();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::discovery
