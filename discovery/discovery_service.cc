#include "discovery/discovery_service.h"

#include "proto/base/log.h"
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "proto/base/log_limiter.h"
#include "proto/base/secure_compare.h"

namespace pdr::discovery {
namespace {

constexpr const char* kMonitorEndpoint = "inproc://pdr-discovery-monitor";
constexpr const char* kCurveMonitorEndpoint = "inproc://pdr-discovery-curve-monitor";
// libzmq looks for its ZAP handler at this fixed address in the socket's context (RFC 27).
constexpr const char* kZapEndpoint = "inproc://zeromq.zap.01";
// A connection that has not finished the ZMTP handshake by then is dropped (libzmq's default is
// 30 s, which let raw TCP connections that never greet hold a descriptor each that long).
constexpr int kHandshakeMs = 5000;
constexpr int kMaxMessagesPerWake = 4096;  // bound one poll round so timers and commands run
constexpr int kSmallBatch = 64;            // below this, the next wake waits for batch_window

// "tcp://host:0" -> "tcp://host:*": ZMQ's spelling of an ephemeral port.
std::string zmq_bind_spelling(const std::string& endpoint) {
  if (endpoint.size() > 2 && endpoint.compare(endpoint.size() - 2, 2, ":0") == 0) {
    return endpoint.substr(0, endpoint.size() - 1) + "*";
  }
  return endpoint;
}

}  // namespace

DiscoveryServiceOptions DiscoveryServiceOptions::from(const config::Topology& t) {
  DiscoveryServiceOptions o;
  o.bind_endpoint = t.listeners.discovery;
  o.registry = RegistryOptions::from(t.discovery);
  o.limits.max_message_bytes = t.discovery.max_message_bytes;
  o.curve_endpoint = t.listeners.discovery_curve;
  o.curve_keys = t.discovery.curve.server_keys;
  o.zap.allowed_peers = t.discovery.allowed_peers;
  o.zap.allowed_client_keys = {t.discovery.curve.allowed_client_keys.begin(),
                               t.discovery.curve.allowed_client_keys.end()};
  o.zap.plain_is_local = t.listeners.discovery.starts_with("ipc://");
  o.auth_token = t.discovery.auth_token;
  o.allow_unauthenticated_vllm = t.discovery.allow_unauthenticated_vllm;
  o.static_instances = t.static_instances;
  o.hard_frame_limit = std::max<int64_t>(1024 * 1024, 2 * int64_t{t.discovery.max_message_bytes});
  return o;
}

class DiscoveryService::Impl {
  // Who sent a message: its admission class from the handshake, its peer address (nullopt over
  // ipc://) and the socket to answer on.
  struct Sender {
    config::AdmissionClass admission;
    std::optional<config::IpAddress> peer;
    zmq::socket_t* socket;
  };

 public:
  Impl(SnapshotCell<RegistrySnapshot>& snapshots, DiscoveryCounters& counters)
      : snapshots_(snapshots), counters_(counters), registry_(RegistryOptions{}) {}

  ~Impl() {
    stop();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  Status start(const DiscoveryServiceOptions& options) {
    if (thread_.joinable()) return Status(StatusCode::kInternal, "discovery service already started");
    options_ = options;
    registry_.set_options(options.registry);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status(StatusCode::kIoError, std::string("eventfd: ") + std::strerror(errno));
    try {
      // The ZAP handler first: a connection that handshakes before it exists would be admitted
      // unchecked (libzmq treats a missing handler as "allow").
      zap_ = zmq::socket_t(context_, zmq::socket_type::rep);
      zap_.set(zmq::sockopt::linger, 0);
      zap_.bind(kZapEndpoint);
      router_ = open_router(kPlainDomain, kMonitorEndpoint, &monitor_, nullptr);
      router_.bind(zmq_bind_spelling(options.bind_endpoint));
      bound_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status(StatusCode::kIoError,
                    "discovery: cannot bind '" + options.bind_endpoint + "': " + e.what());
    }
    if (!options.curve_endpoint.empty()) {
      try {
        curve_router_ = open_router(kCurveDomain, kCurveMonitorEndpoint, &curve_monitor_, &options.curve_keys);
        curve_router_.bind(zmq_bind_spelling(options.curve_endpoint));
        bound_curve_endpoint_ = curve_router_.get(zmq::sockopt::last_endpoint);
      } catch (const zmq::error_t& e) {
        return Status(StatusCode::kIoError,
                      "discovery: cannot bind CURVE endpoint '" + options.curve_endpoint + "': " + e.what());
      }
    }
    registry_.replace_static(options.static_instances, Clock::now());
    publish(Clock::now());
    running_.store(true);
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  std::string bound_endpoint() const { return bound_endpoint_; }
  std::string bound_curve_endpoint() const { return bound_curve_endpoint_; }

  void post(std::function<void(Registry&)> fn, std::function<void()> on_published) {
    {
      std::lock_guard<std::mutex> lock(commands_mutex_);
      commands_.push_back({std::move(fn), std::move(on_published)});
    }
    wake();
  }

  void apply_topology(const config::Topology& t) {
    DiscoveryServiceOptions next = DiscoveryServiceOptions::from(t);
    {
      std::lock_guard<std::mutex> lock(commands_mutex_);
      pending_options_ = std::move(next);
    }
    wake();
  }

  void stop() {
    if (!running_.exchange(false)) return;
    wake();
    if (thread_.joinable()) thread_.join();
  }

 private:
  zmq::socket_t open_router(std::string_view zap_domain, const char* monitor_endpoint, zmq::socket_t* monitor,
                            const proto::CurveKeyPair* curve) {
    zmq::socket_t router(context_, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    router.set(zmq::sockopt::maxmsgsize, options_.hard_frame_limit);
    router.set(zmq::sockopt::sndhwm, 10000);
    // A few messages per peer are plenty for heartbeats; the default 1000 frames of up to
    // hard_frame_limit each would let one fast peer queue a gigabyte behind a busy thread.
    router.set(zmq::sockopt::rcvhwm, 100);
    router.set(zmq::sockopt::handshake_ivl, kHandshakeMs);
    // P2P-NCCL nodes connect with their zmq_address as routing id. A node restarted while its
    // old connection is still open on our side (host crash, partition: no FIN) comes back with
    // the same id, and by default libzmq silently drops everything it sends until that old
    // connection dies (hours with default TCP keepalive). Handover gives the id to the newest
    // connection.
    router.set(zmq::sockopt::router_handover, 1);
    // Every connection asks the ZAP handler (NULL mechanism only does with a domain set).
    router.set(zmq::sockopt::zap_domain, std::string(zap_domain));
    if (curve != nullptr) {
      router.set(zmq::sockopt::curve_server, 1);
      router.set(zmq::sockopt::curve_secretkey, curve->secret_z85);
    }
    // Monitor accepted/disconnected peers: libzmq drops peers that exceed maxmsgsize without
    // telling the application, so disconnects are the only trace of such frames. And handshakes
    // that fail before the ZAP handler is asked (a NULL client on the CURVE endpoint, a CURVE
    // client with the wrong server key): the monitor is the only place they show.
    zmq_socket_monitor(router.handle(), monitor_endpoint,
                       ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
    *monitor = zmq::socket_t(context_, zmq::socket_type::pair);
    monitor->connect(monitor_endpoint);
    return router;
  }

  void wake() {
    if (wake_fd_ < 0) return;
    uint64_t one = 1;
    // A full counter (EAGAIN) still leaves the fd readable, which is all the wake needs.
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void run() {
    try {
      loop();
    } catch (const std::exception& e) {
      // Nothing on this thread should throw; if it does, the registry freezes visibly.
      pdr::log::critical("discovery thread stopped: {}", e.what());
    }
    router_.close();
    monitor_.close();
    if (curve_router_) curve_router_.close();
    if (curve_monitor_) curve_monitor_.close();
    zap_.close();
  }

  void loop() {
    // The ROUTERs go last so a coalescing round can leave them out of the poll set entirely (with
    // events=0 zmq_poll would still wake on their signalers).
    std::vector<zmq::pollitem_t> items = {
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
        {zap_.handle(), 0, ZMQ_POLLIN, 0},
        {monitor_.handle(), 0, ZMQ_POLLIN, 0},
    };
    if (curve_router_) items.push_back({curve_monitor_.handle(), 0, ZMQ_POLLIN, 0});
    const size_t first_router = items.size();
    items.push_back({router_.handle(), 0, ZMQ_POLLIN, 0});
    if (curve_router_) items.push_back({curve_router_.handle(), 0, ZMQ_POLLIN, 0});
    while (running_.load(std::memory_order_relaxed)) {
      // After a small batch, leave the ROUTERs out of the next poll for batch_window: messages
      // queue in libzmq meanwhile and the next wake takes them together. At 10k nodes beating
      // every 3 s this turns ~3,300 wake-ups/s into a few hundred, for at most batch_window of
      // added registration latency. Commands, handshakes and the monitors still wake the thread
      // at once.
      const auto now = Clock::now();
      const bool coalescing = now < coalesce_until_;
      for (auto& item : items) item.revents = 0;
      auto timeout = poll_timeout(now);
      if (coalescing) {
        timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(coalesce_until_ - now));
      }
      try {
        zmq::poll(items.data(), coalescing ? first_router : items.size(), timeout);
      } catch (const zmq::error_t& e) {
        // A signal delivered to this thread interrupts poll(); that is not an error.
        if (e.num() == EINTR) continue;
        throw;
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t drained;
        [[maybe_unused]] ssize_t n = ::read(wake_fd_, &drained, sizeof drained);
        run_commands();
      }
      if (items[1].revents & ZMQ_POLLIN) drain_zap();
      for (size_t i = 2; i < first_router; ++i) {
        if (items[i].revents & ZMQ_POLLIN) drain_monitor(i == 2 ? monitor_ : curve_monitor_);
      }
      int handled = 0;
      bool polled_router = false;
      for (size_t i = first_router; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        polled_router = true;
        const bool curve = i > first_router;
        handled += drain_router(curve ? curve_router_ : router_, curve);
      }
      if (polled_router && handled < kSmallBatch) coalesce_until_ = Clock::now() + options_.batch_window;
      const auto after = Clock::now();
      const auto expired = registry_.expire_due(after);
      if (expired.expired > 0) {
        counters_.expiries.fetch_add(expired.expired, std::memory_order_relaxed);
        pdr::log::info("discovery: {} instance(s) expired (no heartbeat within TTL)", expired.expired);
      }
      counters_.removed_after_retention.fetch_add(expired.removed, std::memory_order_relaxed);
      maybe_publish(after);
      // Acks and command completions go out after the publish, so whoever they notify already
      // sees the change in the snapshot.
      flush_acks();
      run_completions();
    }
  }

  // Answers every pending ZAP request (RFC 27) with the policy's decision.
  void drain_zap() {
    for (int i = 0; i < kMaxMessagesPerWake; ++i) {
      std::vector<std::string> frames;
      zmq::message_t frame;
      if (!zap_.recv(frame, zmq::recv_flags::dontwait)) return;
      frames.emplace_back(static_cast<const char*>(frame.data()), frame.size());
      // Read every frame of the request (a REP socket must before it answers); keep a few.
      while (frame.more()) {
        if (!zap_.recv(frame, zmq::recv_flags::dontwait)) break;
        if (frames.size() < 16) frames.emplace_back(static_cast<const char*>(frame.data()), frame.size());
      }
      const ZapDecision decision = decide_zap(options_.zap, frames);
      if (decision.allow) {
        counters_.handshakes_admitted.fetch_add(1, std::memory_order_relaxed);
      } else {
        counters_.refuse_handshake(decision.refusal);
        if (log_limiter_.allow(Clock::now())) {
          pdr::log::warn("discovery: refused connection ({}): {}", to_string(decision.refusal), decision.status_text);
        }
      }
      const auto reply = zap_reply(frames.size() > 1 ? frames[1] : "", decision);
      try {
        for (size_t f = 0; f < reply.size(); ++f) {
          zap_.send(zmq::buffer(reply[f]), f + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
        }
      } catch (const zmq::error_t& e) {
        pdr::log::warn("discovery: ZAP reply not sent: {}", e.what());
      }
    }
  }

  std::chrono::milliseconds poll_timeout(Clock::time_point now) const {
    auto until = now + std::chrono::seconds(1);
    if (auto d = registry_.next_deadline()) until = std::min(until, *d);
    if (until <= now) return std::chrono::milliseconds(0);
    // Round up so we never wake just before a deadline and spin.
    return std::chrono::ceil<std::chrono::milliseconds>(until - now);
  }

  void maybe_publish(Clock::time_point now) {
    if (registry_.dirty()) publish(now);
  }

  void publish(Clock::time_point now) {
    snapshots_.publish(registry_.snapshot(now));
    counters_.snapshots_published.fetch_add(1, std::memory_order_relaxed);
  }

  void run_completions() {
    // Swap first: a completion may post again (it only queues).
    std::vector<std::function<void()>> done;
    done.swap(completions_);
    for (auto& fn : done) fn();
  }

  void run_commands() {
    std::vector<Command> commands;
    std::optional<DiscoveryServiceOptions> options;
    {
      std::lock_guard<std::mutex> lock(commands_mutex_);
      commands.swap(commands_);
      options.swap(pending_options_);
    }
    if (options) {
      if (options->bind_endpoint != options_.bind_endpoint) {
        pdr::log::warn("discovery: listener endpoint change to '{}' needs a restart; still on '{}'",
                     options->bind_endpoint, bound_endpoint_);
      }
      if (options->curve_endpoint != options_.curve_endpoint ||
          options->curve_keys.secret_z85 != options_.curve_keys.secret_z85) {
        pdr::log::warn("discovery: CURVE endpoint or server key changes need a restart; keeping '{}'",
                     bound_curve_endpoint_);
      }
      options->bind_endpoint = options_.bind_endpoint;
      options->curve_endpoint = options_.curve_endpoint;
      options->curve_keys = options_.curve_keys;
      // Both endpoints keep the transport they were bound with.
      options->zap.plain_is_local = options_.zap.plain_is_local;
      options->hard_frame_limit = options_.hard_frame_limit;  // a socket option fixed at bind
      options_ = std::move(*options);
      registry_.set_options(options_.registry);
      registry_.replace_static(options_.static_instances, Clock::now());
    }
    for (Command& command : commands) {
      command.fn(registry_);
      if (command.on_published) completions_.push_back(std::move(command.on_published));
    }
  }

  void drain_monitor(zmq::socket_t& monitor) {
    for (;;) {
      zmq::message_t event;
      if (!monitor.recv(event, zmq::recv_flags::dontwait)) return;
      if (event.more()) {  // second frame: the endpoint string
        zmq::message_t endpoint;
        (void)monitor.recv(endpoint, zmq::recv_flags::dontwait);
      }
      // The event frame: a 16-bit event id, then a 32-bit value (zmq_socket_monitor(3)).
      if (event.size() < sizeof(uint16_t)) continue;
      uint16_t id;
      std::memcpy(&id, event.data(), sizeof id);
      uint32_t value = 0;
      if (event.size() >= sizeof id + sizeof value) {
        std::memcpy(&value, static_cast<const char*>(event.data()) + sizeof id, sizeof value);
      }
      if (id == ZMQ_EVENT_ACCEPTED) counters_.peer_connections.fetch_add(1, std::memory_order_relaxed);
      if (id == ZMQ_EVENT_DISCONNECTED) counters_.peer_disconnects.fetch_add(1, std::memory_order_relaxed);
      if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        const HandshakeRefusal refusal = handshake_failure_refusal(value);
        counters_.refuse_handshake(refusal);
        if (log_limiter_.allow(Clock::now())) {
          pdr::log::warn("discovery: refused connection ({}): handshake failed before admission (ZMTP error 0x{:x})",
                         to_string(refusal), value);
        }
      }
    }
  }

  // Returns how many messages it took off the socket.
  int drain_router(zmq::socket_t& router, bool curve) {
    int i = 0;
    for (; i < kMaxMessagesPerWake; ++i) {
      zmq::message_t identity;
      if (!router.recv(identity, zmq::recv_flags::dontwait)) return i;
      counters_.frames_received.fetch_add(1, std::memory_order_relaxed);
      if (!identity.more()) {
        reject(RejectReason::kBadFrames, "message with an identity frame only");
        continue;
      }
      zmq::message_t payload;
      (void)router.recv(payload, zmq::recv_flags::dontwait);  // parts of one message arrive together
      if (payload.more()) {
        size_t frames = 2;
        zmq::message_t extra;
        while (router.recv(extra, zmq::recv_flags::dontwait) && ++frames && extra.more()) {
        }
        reject(RejectReason::kBadFrames,
               fmt::format("expected [identity, payload], got {} frames", frames));
        continue;
      }
      handle_payload(identity, payload, sender_of(payload, curve));
    }
    return i;
  }

  // How the connection a message came on was admitted, from the properties libzmq attached to it
  // after the handshake.
  Sender sender_of(zmq::message_t& payload, bool curve) {
    Sender sender{options_.zap.address_class(), std::nullopt, curve ? &curve_router_ : &router_};
    const char* user_id = zmq_msg_gets(payload.handle(), "User-Id");
    if (user_id != nullptr) sender.admission = user_id_class(user_id, sender.admission);
    const char* peer = zmq_msg_gets(payload.handle(), "Peer-Address");
    if (peer != nullptr) sender.peer = config::parse_ip_address(peer);
    return sender;
  }

  void handle_payload(const zmq::message_t& identity, const zmq::message_t& payload, const Sender& sender) {
    proto::DiscoveryMessage msg;
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(payload.data()), payload.size());
    Status st = proto::decode_discovery_message(bytes, options_.limits, &msg);
    if (!st.is_ok()) {
      reject(reject_reason_for(st.code()), st.to_string());
      return;
    }
    switch (msg.kind) {
      case proto::DiscoveryMessage::Kind::kHello:
        counters_.hellos.fetch_add(1, std::memory_order_relaxed);
        return;
      case proto::DiscoveryMessage::Kind::kGoodbye:
        handle_goodbye(identity, msg.goodbye, sender);
        return;
      case proto::DiscoveryMessage::Kind::kRegistration:
        handle_registration(identity, msg.registration, sender);
        return;
    }
  }

  // The message's admission class after the auth token, or nullopt when the token check refuses it.
  std::optional<config::AdmissionClass> message_class(uint32_t schema_version, const std::string& token,
                                              config::AdmissionClass connection) const {
    if (options_.auth_token.empty()) return connection;
    if (schema_version == 0) {
      if (!options_.allow_unauthenticated_vllm) return std::nullopt;
      return connection;
    }
    if (!secure_equals(token, options_.auth_token)) return std::nullopt;
    return std::max(connection, config::AdmissionClass::kToken);
  }

  // Admission checks common to registrations and goodbyes; false (and the refusal handled) when
  // the message must change nothing. `reg`: the registration whose every address is checked
  // (config::find_foreign_address); null for a goodbye, whose one address is `address`.
  bool admit(const zmq::message_t& identity, const Sender& sender, uint32_t schema_version,
             const std::string& token, const proto::HostPort& address, const proto::Registration* reg,
             bool ack_refusal, config::AdmissionClass* out) {
    const std::string key = address.to_string();
    auto cls = message_class(schema_version, token, sender.admission);
    if (!cls) {
      reject(RejectReason::kUnauthenticated, "message for " + key + " has no valid auth token");
      if (ack_refusal) send_ack(identity, *sender.socket, {false, "unauthenticated: missing or wrong auth token", 0, 0});
      return false;
    }
    std::optional<config::ForeignAddress> foreign;
    if (reg != nullptr) {
      foreign = config::find_foreign_address(*cls, sender.peer, *reg);
    } else if (const auto check = config::check_registered_address(*cls, sender.peer, address.host);
               check != config::AddressCheck::kOwn) {
      foreign = config::ForeignAddress{"http_address", address.host, check};
    }
    if (foreign) {
      refuse_foreign(identity, sender, key, *foreign, ack_refusal);
      return false;
    }
    *out = *cls;
    return true;
  }

  // A node that does not authenticate may name only its own address (discovery/config/admission.h): the
  // router connects out to every address a registration names (HTTP legs, the KV events sockets)
  // and hands the zmq_address to the paired node, so any registrant could otherwise aim them at
  // a third host. A host name is refused before it is ever resolved.
  void refuse_foreign(const zmq::message_t& identity, const Sender& sender, const std::string& key,
                      const config::ForeignAddress& foreign, bool ack_refusal) {
    const std::string from = sender.peer ? peer_text(*sender.peer) : "?";
    if (foreign.check == config::AddressCheck::kHostName) {
      reject(RejectReason::kHostName,
             fmt::format("message for {} from {} names the host {} in {}: a node that does not authenticate "
                         "must give its own IP address (names need the auth token or CURVE)",
                         key, from, foreign.host, foreign.field));
      if (ack_refusal) {
        send_ack(identity, *sender.socket,
                 {false, fmt::format("forbidden: {} is a host name; a node that does not authenticate must give its "
                                     "own IP address (authenticate to use names)", foreign.field), 0, 0});
      }
      return;
    }
    reject(RejectReason::kNotSelf,
           fmt::format("message for {} from {} names {} in {}: a node that does not authenticate may name only "
                       "its own address", key, from, foreign.host, foreign.field));
    if (ack_refusal) {
      send_ack(identity, *sender.socket,
               {false, fmt::format("forbidden: {} is not the sender's own address (authenticate to name another)",
                                   foreign.field), 0, 0});
    }
  }

  static std::string peer_text(const config::IpAddress& a) {
    config::Cidr c{a, static_cast<uint8_t>(a.size * 8)};
    std::string text = c.to_string();
    return text.substr(0, text.rfind('/'));
  }

  void handle_registration(const zmq::message_t& identity, const proto::Registration& reg, const Sender& sender) {
    const bool wants_ack = reg.schema_version > 0;
    config::AdmissionClass cls;
    if (!admit(identity, sender, reg.schema_version, reg.auth_token, reg.http_address, &reg, wants_ack, &cls)) return;
    const auto now = Clock::now();
    const auto outcome = registry_.upsert(reg, now, cls);
    const std::string key = reg.http_address.to_string();
    auto refuse = [&](RejectReason why, const std::string& detail, const std::string& ack_reason) {
      reject(why, detail);
      if (wants_ack) send_ack(identity, *sender.socket, {false, ack_reason, 0, 0});
    };
    switch (outcome.result) {
      case UpsertResult::kRejectedFull:
        refuse(RejectReason::kRegistryFull,
               fmt::format("registry full ({} instances); {} refused", registry_.size(), key),
               "rejected: registry full");
        return;
      case UpsertResult::kRejectedClassFull:
        refuse(RejectReason::kClassFull,
               fmt::format("{} nodes admitted by '{}' reached discovery.max_instances_per_class; {} refused",
                           registry_.count_by_class()[static_cast<size_t>(cls)], to_string(cls), key),
               "rejected: registry full for this admission class");
        return;
      case UpsertResult::kRejectedWeaker:
        refuse(RejectReason::kWeakerSender,
               fmt::format("{} was registered by a stronger sender; a '{}' message cannot change it", key,
                           to_string(cls)),
               "forbidden: this instance was registered with stronger credentials");
        return;
      case UpsertResult::kRejectedStaleEpoch:
        refuse(RejectReason::kStaleEpoch,
               fmt::format("registration for {} with epoch {} is older than the running process", key, reg.epoch),
               "rejected: stale epoch");
        return;
      case UpsertResult::kAdded:
        counters_.added.fetch_add(1, std::memory_order_relaxed);
        pdr::log::info("discovery: registered {} {} ({} via {}, admitted by {})", proto::to_string(reg.role), key,
                     proto::to_string(reg.connector), proto::to_string(reg.format), to_string(cls));
        break;
      case UpsertResult::kRestarted:
        counters_.restarts.fetch_add(1, std::memory_order_relaxed);
        pdr::log::info("discovery: {} restarted (epoch {})", key, reg.epoch);
        break;
      case UpsertResult::kRevived:
        counters_.revived.fetch_add(1, std::memory_order_relaxed);
        pdr::log::info("discovery: {} is back", key);
        break;
      case UpsertResult::kUpdated:
        break;
    }
    counters_.accepted_by_format[static_cast<size_t>(reg.format)].fetch_add(1, std::memory_order_relaxed);
    if (wants_ack) send_ack(identity, *sender.socket, {true, "", static_cast<uint32_t>(outcome.ttl.count()), 0});
  }

  void handle_goodbye(const zmq::message_t& identity, const proto::Goodbye& goodbye, const Sender& sender) {
    config::AdmissionClass cls;
    if (!admit(identity, sender, goodbye.schema_version, goodbye.auth_token, goodbye.http_address, nullptr, true,
               &cls)) {
      return;
    }
    const std::string key = goodbye.http_address.to_string();
    auto refuse = [&](RejectReason why, const std::string& detail, const std::string& ack_reason) {
      reject(why, detail);
      send_ack(identity, *sender.socket, {false, ack_reason, 0, 0});
    };
    switch (registry_.goodbye(goodbye, Clock::now(), cls)) {
      case GoodbyeResult::kRemoved:
        counters_.goodbyes.fetch_add(1, std::memory_order_relaxed);
        pdr::log::info("discovery: {} said goodbye", key);
        send_ack(identity, *sender.socket, {true, "", 0, 0});
        return;
      case GoodbyeResult::kUnknown:
        refuse(RejectReason::kUnknownGoodbye, "goodbye for unknown instance " + key,
               "not_found: " + key + " is not registered");
        return;
      case GoodbyeResult::kStaleEpoch:
        refuse(RejectReason::kStaleGoodbye,
               fmt::format("goodbye for {} does not carry its current epoch (got {})", key, goodbye.epoch),
               "rejected: stale epoch");
        return;
      case GoodbyeResult::kWeaker:
        refuse(RejectReason::kWeakerSender,
               fmt::format("goodbye for {} from a '{}' sender; it was registered with stronger credentials", key,
                           to_string(cls)),
               "forbidden: this instance was registered with stronger credentials");
        return;
      case GoodbyeResult::kOperatorOwned:
        refuse(RejectReason::kOperatorOwned,
               "goodbye for " + key + " ignored: static and admin instances are removed by the operator only",
               "forbidden: static or admin instance");
        return;
    }
  }

  // Queues an ack; flush_acks() sends it after the next publish, on the socket it came from.
  void send_ack(const zmq::message_t& identity, zmq::socket_t& socket, proto::Ack ack) {
    pending_acks_.push_back(
        {std::string(static_cast<const char*>(identity.data()), identity.size()), &socket, std::move(ack)});
  }

  void flush_acks() {
    for (auto& [identity, socket, ack] : pending_acks_) {
      if (ack.ok) ack.registry_version = registry_.version();
      const std::string body = proto::encode_ack(ack);
      try {
        // dontwait: a peer that stopped reading must not stall the discovery thread.
        if (socket->send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
            socket->send(zmq::buffer(body), zmq::send_flags::dontwait)) {
          counters_.acks_sent.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const zmq::error_t& e) {
        pdr::log::debug("discovery: ack not sent: {}", e.what());
      }
    }
    pending_acks_.clear();
  }

  void reject(RejectReason reason, const std::string& detail) {
    counters_.reject(reason);
    if (log_limiter_.allow(Clock::now())) {
      pdr::log::warn("discovery: rejected message ({}): {}", to_string(reason), detail);
    }
  }

  SnapshotCell<RegistrySnapshot>& snapshots_;
  DiscoveryCounters& counters_;
  Registry registry_;
  DiscoveryServiceOptions options_;
  zmq::context_t context_{1};
  zmq::socket_t zap_;
  zmq::socket_t router_;
  zmq::socket_t monitor_;
  zmq::socket_t curve_router_;
  zmq::socket_t curve_monitor_;
  std::string bound_endpoint_;
  std::string bound_curve_endpoint_;
  int wake_fd_ = -1;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex commands_mutex_;
  struct Command {
    std::function<void(Registry&)> fn;
    std::function<void()> on_published;
  };
  std::vector<Command> commands_;
  std::vector<std::function<void()>> completions_;  // discovery thread only
  std::optional<DiscoveryServiceOptions> pending_options_;
  LogLimiter log_limiter_{"discovery"};
  Clock::time_point coalesce_until_{};
  struct PendingAck {
    std::string identity;
    zmq::socket_t* socket;
    proto::Ack ack;
  };
  std::vector<PendingAck> pending_acks_;
};

DiscoveryService::DiscoveryService(SnapshotCell<RegistrySnapshot>& snapshots, DiscoveryCounters& counters)
    : impl_(std::make_unique<Impl>(snapshots, counters)) {}
DiscoveryService::~DiscoveryService() = default;
Status DiscoveryService::start(const DiscoveryServiceOptions& o) { return impl_->start(o); }
std::string DiscoveryService::bound_endpoint() const { return impl_->bound_endpoint(); }
std::string DiscoveryService::bound_curve_endpoint() const { return impl_->bound_curve_endpoint(); }
void DiscoveryService::apply_topology(const config::Topology& t) { impl_->apply_topology(t); }
void DiscoveryService::post(std::function<void(Registry&)> fn, std::function<void()> on_published) {
  impl_->post(std::move(fn), std::move(on_published));
}
void DiscoveryService::stop() { impl_->stop(); }

}  // namespace pdr::discovery
