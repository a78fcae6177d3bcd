// NodeClient: the node side of discovery. Heartbeats one Registration to one or more router
// endpoints (ZMQ DEALER per endpoint, like vLLM's heartbeat child: LINGER 0, SNDTIMEO), reads
// pdrouter's acknowledgements when the registration is in the pdrouter format, and sends a goodbye
// on request when stopping.
//
// Threads: the client owns one background thread with its own zmq::context_t; that thread alone
// touches the sockets. Other threads reach it only through a mutex-protected command queue whose
// wake-up is an eventfd polled next to the sockets. start() and stop() are lifecycle calls made by
// the owning thread (not concurrently with each other); pause(), resume(), update_load(),
// set_draining(), stats() and last_ack() may be called from any thread at any time, before start()
// too (the command is then applied when the thread starts).
//
// Sending: every send is non-blocking (ZMQ_DONTWAIT) into a per-endpoint queue of a few messages,
// so an unreachable router neither delays heartbeats to the others nor holds up stop(); a full
// queue counts as a send failure. SNDTIMEO is still set to send_timeout, as vLLM does, as the bound
// for any blocking send. Queued messages are dropped at stop (LINGER 0) except a goodbye.
//
// Timing: the first heartbeat goes out as soon as start() returns, then one every `interval`.
// resume() and set_draining() send one at once (the router should learn quickly); update_load()
// rides on the next regular heartbeat.
//
// Wire facts: each heartbeat is one frame (the router's ROUTER socket sees [identity, payload]).
// P2P-NCCL nodes set the DEALER identity to their zmq_address, so the client does too for that
// format. MoRIIO legacy registrations carry an `index` that counts pings; the client increments it.
// Only the pdrouter format (which carries `pdr_v`) gets acks and has a goodbye message; the plain
// vLLM dialects are fire-and-forget.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "proto/discovery_message.h"
#include "proto/base/status.h"

namespace pdr::sidecar {

struct NodeClientOptions {
  std::vector<std::string> router_endpoints;  // ZMQ endpoints, e.g. "tcp://10.0.0.1:36367"
  proto::Registration registration;
  std::chrono::milliseconds interval{3000};      // heartbeat period
  std::chrono::milliseconds send_timeout{1000};  // SNDTIMEO (sends use DONTWAIT; see above)
  std::chrono::milliseconds goodbye_linger{1000};  // how long stop() waits to flush a goodbye
  // CURVE (for a router's listeners.discovery_curve endpoint): the router's public key (Z85) and
  // this node's key pair. Empty curve_server_key = plain connection. With a server key and no
  // client key, an ephemeral key pair is made (encrypted, but only address-admitted).
  std::string curve_server_key;
  std::string curve_public_key;
  std::string curve_secret_key;
};

struct NodeClientStats {
  uint64_t heartbeats_sent = 0;  // successful sends, counted per endpoint
  uint64_t send_failures = 0;    // sends that timed out or failed, per endpoint
  uint64_t acks_received = 0;    // well-formed acks (ok or not)
  uint64_t acks_rejected = 0;    // acks with ok == false, plus acks that did not decode
  uint64_t goodbyes_sent = 0;    // per endpoint
  std::string last_ack_reason;   // reason of the last rejecting ack (or its decode error)
};

class NodeClient {
 public:
  // Applies the registration defaults (see effective_registration()). Opens no sockets.
  explicit NodeClient(NodeClientOptions options);
  // Stops without a goodbye if still running.
  ~NodeClient();

  NodeClient(const NodeClient&) = delete;
  NodeClient& operator=(const NodeClient&) = delete;

  // Creates the sockets, connects them (errors such as a malformed endpoint are reported here) and
  // starts the thread, which sends the first heartbeat immediately. Fails if already started, if
  // there are no endpoints, or if the registration cannot be encoded.
  Status start();

  // Stops heartbeating without telling the router (it will expire the node); resume() restarts
  // with an immediate heartbeat. Any thread.
  void pause();
  void resume();
  // Load carried by later heartbeats (pdrouter format only). Any thread.
  void update_load(const proto::NodeLoad& load);
  // Draining flag (pdrouter format only); sends a heartbeat at once unless paused. Any thread.
  void set_draining(bool draining);

  // Stops the thread and closes the sockets. With send_goodbye and the pdrouter format, sends a
  // goodbye to every endpoint and waits up to goodbye_linger for it to be flushed; otherwise
  // returns without waiting for queued heartbeats (LINGER 0). Idempotent; safe before start().
  void stop(bool send_goodbye);

  bool running() const { return running_.load(std::memory_order_acquire); }
  NodeClientStats stats() const;
  // Last ack received from router_endpoints[index], if any. Any thread.
  std::optional<proto::Ack> last_ack(size_t endpoint_index) const;
  // The registration with defaults applied (what the first heartbeat carries): when
  // schema_version > 0, epoch defaults to the unix time in ms and instance_id to "hostname:pid";
  // the pdrouter format implies schema_version >= 1. Later load/draining updates are not reflected.
  const proto::Registration& effective_registration() const { return initial_registration_; }

 private:
  struct Command {
    enum class Kind : uint8_t { kPause, kResume, kUpdateLoad, kSetDraining, kStop };
    Kind kind = Kind::kPause;
    proto::NodeLoad load;
    bool flag = false;  // draining for kSetDraining, send_goodbye for kStop
  };
  class Worker;  // owns the ZMQ context and sockets; lives on the client thread

  void post(Command command);

  NodeClientOptions options_;
  proto::Registration initial_registration_;
  int wake_fd_ = -1;  // eventfd: post() writes, the worker polls it

  mutable std::mutex mutex_;  // guards commands_ and acks_, and last_ack_reason_
  std::deque<Command> commands_;
  std::vector<std::optional<proto::Ack>> acks_;
  std::string last_ack_reason_;

  std::atomic<uint64_t> heartbeats_sent_{0};
  std::atomic<uint64_t> send_failures_{0};
  std::atomic<uint64_t> acks_received_{0};
  std::atomic<uint64_t> acks_rejected_{0};
  std::atomic<uint64_t> goodbyes_sent_{0};

  std::mutex lifecycle_mutex_;  // serialises start() and stop()
  std::atomic<bool> running_{false};
  std::unique_ptr<Worker> worker_;
  std::thread thread_;
};

// Fills the defaults described at NodeClient::effective_registration(). Exposed for tests.
proto::Registration with_registration_defaults(proto::Registration registration);

}  // namespace pdr::sidecar
