#include "discovery/discovery_service.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <zmq.hpp>

#include "discovery/log_limiter.h"
#include "proto/secure_compare.h"

namespace pdr::discovery {
namespace {

constexpr const char* kMonitorEndpoint = "inproc://pdr-discovery-monitor";
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

DiscoveryServiceOptions DiscoveryServiceOptions::from(const Topology& t) {
  DiscoveryServiceOptions o;
  o.bind_endpoint = t.listeners.discovery;
  o.registry = RegistryOptions::from(t.discovery);
  o.limits.max_message_bytes = t.discovery.max_message_bytes;
  o.auth_token = t.discovery.auth_token;
  o.allow_unauthenticated_vllm = t.discovery.allow_unauthenticated_vllm;
  o.static_instances = t.static_instances;
  o.hard_frame_limit = std::max<int64_t>(1024 * 1024, 2 * int64_t{t.discovery.max_message_bytes});
  return o;
}

class DiscoveryService::Impl {
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
      router_ = zmq::socket_t(context_, zmq::socket_type::router);
      router_.set(zmq::sockopt::linger, 0);
      router_.set(zmq::sockopt::maxmsgsize, options.hard_frame_limit);
      router_.set(zmq::sockopt::sndhwm, 10000);
      // P2P-NCCL nodes connect with their zmq_address as routing id. A node restarted while its
      // old connection is still open on our side (host crash, partition: no FIN) comes back with
      // the same id, and by default libzmq silently drops everything it sends until that old
      // connection dies (hours with default TCP keepalive). Handover gives the id to the newest
      // connection.
      router_.set(zmq::sockopt::router_handover, 1);
      // Monitor accepted/disconnected peers: libzmq drops peers that exceed maxmsgsize without
      // telling the application, so disconnects are the only trace of such frames.
      zmq_socket_monitor(router_.handle(), kMonitorEndpoint,
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED);
      monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
      monitor_.connect(kMonitorEndpoint);
      router_.bind(zmq_bind_spelling(options.bind_endpoint));
      bound_endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status(StatusCode::kIoError,
                    "discovery: cannot bind '" + options.bind_endpoint + "': " + e.what());
    }
    registry_.replace_static(options.static_instances, Clock::now());
    publish(Clock::now());
    running_.store(true);
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  std::string bound_endpoint() const { return bound_endpoint_; }

  void post(std::function<void(Registry&)> fn, std::function<void()> on_published) {
    {
      std::lock_guard<std::mutex> lock(commands_mutex_);
      commands_.push_back({std::move(fn), std::move(on_published)});
    }
    wake();
  }

  void apply_topology(const Topology& t) {
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
      spdlog::critical("discovery thread stopped: {}", e.what());
    }
    router_.close();
    monitor_.close();
  }

  void loop() {
    // The ROUTER goes last so a coalescing round can leave it out of the poll set entirely (with
    // events=0 zmq_poll would still wake on its signaler).
    zmq::pollitem_t items[3] = {
        {nullptr, wake_fd_, ZMQ_POLLIN, 0},
        {monitor_.handle(), 0, ZMQ_POLLIN, 0},
        {router_.handle(), 0, ZMQ_POLLIN, 0},
    };
    while (running_.load(std::memory_order_relaxed)) {
      // After a small batch, leave the ROUTER out of the next poll for batch_window: messages
      // queue in libzmq meanwhile and the next wake takes them together. At 10k nodes beating
      // every 3 s this turns ~3,300 wake-ups/s into a few hundred, for at most batch_window of
      // added registration latency. Commands and the monitor still wake the thread at once.
      const auto now = Clock::now();
      const bool coalescing = now < coalesce_until_;
      items[2].revents = 0;
      auto timeout = poll_timeout(now);
      if (coalescing) {
        timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(coalesce_until_ - now));
      }
      try {
        zmq::poll(items, coalescing ? 2 : 3, timeout);
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
      if (items[1].revents & ZMQ_POLLIN) drain_monitor();
      if (items[2].revents & ZMQ_POLLIN) {
        const int handled = drain_router();
        if (handled < kSmallBatch) coalesce_until_ = Clock::now() + options_.batch_window;
      }
      const auto after = Clock::now();
      const auto expired = registry_.expire_due(after);
      if (expired.expired > 0) {
        counters_.expiries.fetch_add(expired.expired, std::memory_order_relaxed);
        spdlog::info("discovery: {} instance(s) expired (no heartbeat within TTL)", expired.expired);
      }
      counters_.removed_after_retention.fetch_add(expired.removed, std::memory_order_relaxed);
      maybe_publish(after);
      // Acks and command completions go out after the publish, so whoever they notify already
      // sees the change in the snapshot.
      flush_acks();
      run_completions();
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
        spdlog::warn("discovery: listener endpoint change to '{}' needs a restart; still on '{}'",
                     options->bind_endpoint, bound_endpoint_);
      }
      options->bind_endpoint = options_.bind_endpoint;
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

  void drain_monitor() {
    for (;;) {
      zmq::message_t event;
      if (!monitor_.recv(event, zmq::recv_flags::dontwait)) return;
      if (event.more()) {  // second frame: the endpoint string
        zmq::message_t endpoint;
        (void)monitor_.recv(endpoint, zmq::recv_flags::dontwait);
      }
      if (event.size() < sizeof(uint16_t)) continue;
      uint16_t id;
      std::memcpy(&id, event.data(), sizeof id);
      if (id == ZMQ_EVENT_ACCEPTED) counters_.peer_connections.fetch_add(1, std::memory_order_relaxed);
      if (id == ZMQ_EVENT_DISCONNECTED) counters_.peer_disconnects.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Returns how many messages it took off the socket.
  int drain_router() {
    int i = 0;
    for (; i < kMaxMessagesPerWake; ++i) {
      zmq::message_t identity;
      if (!router_.recv(identity, zmq::recv_flags::dontwait)) return i;
      counters_.frames_received.fetch_add(1, std::memory_order_relaxed);
      if (!identity.more()) {
        reject(RejectReason::kBadFrames, "message with an identity frame only");
        continue;
      }
      zmq::message_t payload;
      (void)router_.recv(payload, zmq::recv_flags::dontwait);  // parts of one message arrive together
      if (payload.more()) {
        size_t frames = 2;
        zmq::message_t extra;
        while (router_.recv(extra, zmq::recv_flags::dontwait) && ++frames && extra.more()) {
        }
        reject(RejectReason::kBadFrames,
               fmt::format("expected [identity, payload], got {} frames", frames));
        continue;
      }
      handle_payload(identity, payload);
    }
    return i;
  }

  void handle_payload(const zmq::message_t& identity, const zmq::message_t& payload) {
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
        handle_goodbye(identity, msg.goodbye);
        return;
      case proto::DiscoveryMessage::Kind::kRegistration:
        handle_registration(identity, msg.registration);
        return;
    }
  }

  bool authenticated(uint32_t schema_version, const std::string& token) const {
    if (options_.auth_token.empty()) return true;
    if (schema_version == 0) return options_.allow_unauthenticated_vllm;
    return secure_equals(token, options_.auth_token);
  }

  void handle_registration(const zmq::message_t& identity, const proto::Registration& reg) {
    const bool wants_ack = reg.schema_version > 0;
    if (!authenticated(reg.schema_version, reg.auth_token)) {
      reject(RejectReason::kUnauthenticated,
             "registration from " + reg.http_address.to_string() + " has no valid auth token");
      if (wants_ack) send_ack(identity, {false, "unauthenticated: missing or wrong auth token", 0, 0});
      return;
    }
    const auto now = Clock::now();
    const auto outcome = registry_.upsert(reg, now);
    const std::string key = reg.http_address.to_string();
    switch (outcome.result) {
      case UpsertResult::kRejectedFull:
        reject(RejectReason::kRegistryFull,
               fmt::format("registry full ({} instances); {} refused", registry_.size(), key));
        if (wants_ack) send_ack(identity, {false, "rejected: registry full", 0, 0});
        return;
      case UpsertResult::kAdded:
        counters_.added.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("discovery: registered {} {} ({} via {})", proto::to_string(reg.role), key,
                     proto::to_string(reg.connector), proto::to_string(reg.format));
        break;
      case UpsertResult::kRestarted:
        counters_.restarts.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("discovery: {} restarted (epoch {})", key, reg.epoch);
        break;
      case UpsertResult::kRevived:
        counters_.revived.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("discovery: {} is back", key);
        break;
      case UpsertResult::kUpdated:
        break;
    }
    counters_.accepted_by_format[static_cast<size_t>(reg.format)].fetch_add(1, std::memory_order_relaxed);
    if (wants_ack) send_ack(identity, {true, "", static_cast<uint32_t>(outcome.ttl.count()), 0});
  }

  void handle_goodbye(const zmq::message_t& identity, const proto::Goodbye& goodbye) {
    if (!authenticated(goodbye.schema_version, goodbye.auth_token)) {
      reject(RejectReason::kUnauthenticated,
             "goodbye for " + goodbye.http_address.to_string() + " has no valid auth token");
      send_ack(identity, {false, "unauthenticated: missing or wrong auth token", 0, 0});
      return;
    }
    const std::string key = goodbye.http_address.to_string();
    switch (registry_.goodbye(goodbye, Clock::now())) {
      case GoodbyeResult::kRemoved:
        counters_.goodbyes.fetch_add(1, std::memory_order_relaxed);
        spdlog::info("discovery: {} said goodbye", key);
        send_ack(identity, {true, "", 0, 0});
        return;
      case GoodbyeResult::kUnknown:
        reject(RejectReason::kUnknownGoodbye, "goodbye for unknown instance " + key);
        send_ack(identity, {false, "not_found: " + key + " is not registered", 0, 0});
        return;
      case GoodbyeResult::kStaleEpoch:
        reject(RejectReason::kStaleGoodbye, "goodbye for " + key + " from an older epoch ignored");
        send_ack(identity, {false, "rejected: stale epoch", 0, 0});
        return;
    }
  }

  // Queues an ack; flush_acks() sends it after the next publish.
  void send_ack(const zmq::message_t& identity, proto::Ack ack) {
    pending_acks_.emplace_back(std::string(static_cast<const char*>(identity.data()), identity.size()),
                               std::move(ack));
  }

  void flush_acks() {
    for (auto& [identity, ack] : pending_acks_) {
      if (ack.ok) ack.registry_version = registry_.version();
      const std::string body = proto::encode_ack(ack);
      try {
        // dontwait: a peer that stopped reading must not stall the discovery thread.
        if (router_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
            router_.send(zmq::buffer(body), zmq::send_flags::dontwait)) {
          counters_.acks_sent.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const zmq::error_t& e) {
        spdlog::debug("discovery: ack not sent: {}", e.what());
      }
    }
    pending_acks_.clear();
  }

  void reject(RejectReason reason, const std::string& detail) {
    counters_.reject(reason);
    if (log_limiter_.allow(Clock::now())) {
      spdlog::warn("discovery: rejected message ({}): {}", to_string(reason), detail);
    }
  }

  SnapshotCell<RegistrySnapshot>& snapshots_;
  DiscoveryCounters& counters_;
  Registry registry_;
  DiscoveryServiceOptions options_;
  zmq::context_t context_{1};
  zmq::socket_t router_;
  zmq::socket_t monitor_;
  std::string bound_endpoint_;
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
  std::vector<std::pair<std::string, proto::Ack>> pending_acks_;
};

DiscoveryService::DiscoveryService(SnapshotCell<RegistrySnapshot>& snapshots, DiscoveryCounters& counters)
    : impl_(std::make_unique<Impl>(snapshots, counters)) {}
DiscoveryService::~DiscoveryService() = default;
Status DiscoveryService::start(const DiscoveryServiceOptions& o) { return impl_->start(o); }
std::string DiscoveryService::bound_endpoint() const { return impl_->bound_endpoint(); }
void DiscoveryService::apply_topology(const Topology& t) { impl_->apply_topology(t); }
void DiscoveryService::post(std::function<void(Registry&)> fn, std::function<void()> on_published) {
  impl_->post(std::move(fn), std::move(on_published));
}
void DiscoveryService::stop() { impl_->stop(); }

}  // namespace pdr::discovery
