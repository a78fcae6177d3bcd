#include "discovery/sidecar/node_client.h"

#include "proto/curve_keys.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <utility>

#include "proto/base/log.h"
#include <zmq.hpp>

namespace pdr::sidecar {
namespace {

using Clock = std::chrono::steady_clock;

// Heartbeats queued for a router that is down are stale by the time it returns; keep few.
constexpr int kSendQueueLimit = 4;

uint64_t unix_time_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

std::string hostname_and_pid() {
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string name = host[0] != '\0' ? host : "unknown";
  return name + ":" + std::to_string(getpid());
}

bool is_pdrouter_format(const proto::Registration& r) {
  return r.format == proto::RegistrationFormat::kPdrouter;
}

void drain_eventfd(int fd) {
  uint64_t value = 0;
  while (read(fd, &value, sizeof(value)) > 0) {
  }
}

}  // namespace

proto::Registration with_registration_defaults(proto::Registration registration) {
  if (is_pdrouter_format(registration) && registration.schema_version == 0) {
    registration.schema_version = 1;
  }
  if (registration.schema_version > 0) {
    // A fresh epoch per process is what lets the router count restarts.
    if (registration.epoch == 0) registration.epoch = unix_time_ms();
    if (registration.instance_id.empty()) registration.instance_id = hostname_and_pid();
  }
  return registration;
}

// Everything that lives on the client thread. Built (and its sockets connected) by start() on the
// caller's thread; the thread start is the memory barrier ZMQ requires to hand sockets over.
class NodeClient::Worker {
 public:
  Worker(NodeClient* owner, proto::Registration registration)
      : owner_(owner), registration_(std::move(registration)) {}

  Status connect_all() {
    try {
      for (const std::string& endpoint : owner_->options_.router_endpoints) {
        zmq::socket_t dealer(context_, zmq::socket_type::dealer);
        dealer.set(zmq::sockopt::linger, 0);
        dealer.set(zmq::sockopt::sndhwm, kSendQueueLimit);
        dealer.set(zmq::sockopt::sndtimeo, static_cast<int>(owner_->options_.send_timeout.count()));
        const NodeClientOptions& o = owner_->options_;
        if (!o.curve_server_key.empty()) {
          dealer.set(zmq::sockopt::curve_serverkey, o.curve_server_key);
          dealer.set(zmq::sockopt::curve_publickey, o.curve_public_key);
          dealer.set(zmq::sockopt::curve_secretkey, o.curve_secret_key);
        }
        // vLLM's P2P-NCCL engine uses its zmq_address as the DEALER identity; match it.
        if (registration_.format == proto::RegistrationFormat::kP2pNccl &&
            !registration_.zmq_address.empty()) {
          dealer.set(zmq::sockopt::routing_id, registration_.zmq_address);
        }
        dealer.connect(endpoint);
        dealers_.push_back(std::move(dealer));
      }
    } catch (const zmq::error_t& e) {
      dealers_.clear();
      return Status(StatusCode::kIoError, "cannot connect DEALER: " + std::string(e.what()));
    }
    return Status::ok();
  }

  void run() {
    bool stopping = apply_commands();
    Clock::time_point next_heartbeat = Clock::now();
    while (!stopping) {
      if (!paused_ && Clock::now() >= next_heartbeat) {
        send_heartbeats();
        next_heartbeat += owner_->options_.interval;
        // After a stall (slow sends), do not burst to catch up.
        if (next_heartbeat < Clock::now()) next_heartbeat = Clock::now() + owner_->options_.interval;
      }
      wait_for_events(paused_ ? std::chrono::milliseconds(-1) : until(next_heartbeat));
      read_acks();
      send_now_ = false;
      stopping = apply_commands();
      if (!stopping && send_now_) next_heartbeat = Clock::now();
    }
    if (send_goodbye_ && is_pdrouter_format(registration_)) send_goodbyes();
    close_all();
  }

 private:
  static std::chrono::milliseconds until(Clock::time_point deadline) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    return left.count() < 0 ? std::chrono::milliseconds(0) : left;
  }

  void wait_for_events(std::chrono::milliseconds timeout) {
    std::vector<zmq_pollitem_t> items;
    items.push_back({nullptr, owner_->wake_fd_, ZMQ_POLLIN, 0});
    if (is_pdrouter_format(registration_)) {
      for (zmq::socket_t& dealer : dealers_) items.push_back({dealer.handle(), 0, ZMQ_POLLIN, 0});
    }
    // EINTR and friends just end this wait early; the loop recomputes the deadline.
    zmq_poll(items.data(), static_cast<int>(items.size()), static_cast<long>(timeout.count()));
    if (items[0].revents & ZMQ_POLLIN) drain_eventfd(owner_->wake_fd_);
  }

  // Returns true when a stop command was seen.
  bool apply_commands() {
    std::deque<Command> commands;
    {
      std::lock_guard lock(owner_->mutex_);
      commands.swap(owner_->commands_);
    }
    for (const Command& c : commands) {
      switch (c.kind) {
        case Command::Kind::kPause: paused_ = true; break;
        case Command::Kind::kResume:
          send_now_ = send_now_ || paused_;
          paused_ = false;
          break;
        case Command::Kind::kUpdateLoad: registration_.load = c.load; break;
        case Command::Kind::kSetDraining:
          send_now_ = send_now_ || registration_.draining != c.flag;
          registration_.draining = c.flag;
          break;
        case Command::Kind::kStop:
          send_goodbye_ = c.flag;
          return true;
      }
    }
    return false;
  }

  void send_heartbeats() {
    if (registration_.format == proto::RegistrationFormat::kMoriioLegacy) {
      registration_.legacy_index = std::to_string(legacy_counter_++);
    }
    const std::string payload = proto::encode_registration(registration_);
    for (zmq::socket_t& dealer : dealers_) {
      if (send_frame(dealer, payload)) {
        owner_->heartbeats_sent_.fetch_add(1, std::memory_order_relaxed);
      } else {
        owner_->send_failures_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  void send_goodbyes() {
    proto::Goodbye goodbye;
    goodbye.http_address = registration_.http_address;
    goodbye.schema_version = registration_.schema_version;
    goodbye.instance_id = registration_.instance_id;
    goodbye.epoch = registration_.epoch;
    goodbye.auth_token = registration_.auth_token;
    const std::string payload = proto::encode_goodbye(goodbye);
    for (zmq::socket_t& dealer : dealers_) {
      try {
        dealer.set(zmq::sockopt::linger, static_cast<int>(owner_->options_.goodbye_linger.count()));
      } catch (const zmq::error_t&) {
      }
      if (send_frame(dealer, payload)) {
        owner_->goodbyes_sent_.fetch_add(1, std::memory_order_relaxed);
      } else {
        owner_->send_failures_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }

  // Never blocks: one dead router must neither delay the heartbeats to the others nor hold up
  // stop(). A full queue (router unreachable for kSendQueueLimit beats) counts as a failure.
  static bool send_frame(zmq::socket_t& dealer, const std::string& payload) {
    try {
      return dealer.send(zmq::buffer(payload), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void read_acks() {
    if (!is_pdrouter_format(registration_)) return;
    for (size_t i = 0; i < dealers_.size(); ++i) {
      std::string payload;
      while (receive_message(dealers_[i], &payload)) record_ack(i, payload);
    }
  }

  // Reads one whole message without blocking; the payload is its last non-empty frame, so a
  // router that adds a REQ-style empty delimiter is understood too.
  static bool receive_message(zmq::socket_t& dealer, std::string* payload) {
    try {
      zmq::message_t frame;
      if (!dealer.recv(frame, zmq::recv_flags::dontwait)) return false;
      payload->clear();
      while (true) {
        if (frame.size() > 0) payload->assign(frame.data<char>(), frame.size());
        if (!frame.more()) return true;
        if (!dealer.recv(frame, zmq::recv_flags::dontwait)) return true;
      }
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void record_ack(size_t endpoint, const std::string& payload) {
    proto::Ack ack;
    Status status = proto::decode_ack(proto::as_bytes(payload), &ack);
    std::lock_guard lock(owner_->mutex_);
    if (!status.is_ok()) {
      owner_->acks_rejected_.fetch_add(1, std::memory_order_relaxed);
      owner_->last_ack_reason_ = "undecodable ack: " + status.to_string();
      return;
    }
    owner_->acks_received_.fetch_add(1, std::memory_order_relaxed);
    if (!ack.ok) {
      owner_->acks_rejected_.fetch_add(1, std::memory_order_relaxed);
      owner_->last_ack_reason_ = ack.reason;
      pdr::log::warn("router {} rejected registration: {}",
                   owner_->options_.router_endpoints[endpoint], ack.reason);
    }
    owner_->acks_[endpoint] = std::move(ack);
  }

  void close_all() {
    for (zmq::socket_t& dealer : dealers_) dealer.close();
    dealers_.clear();
    // Blocks up to the goodbye linger, so the goodbye is flushed before stop() returns.
    context_.close();
  }

  NodeClient* owner_;
  proto::Registration registration_;
  zmq::context_t context_;
  std::vector<zmq::socket_t> dealers_;
  bool paused_ = false;
  bool send_now_ = false;
  bool send_goodbye_ = false;
  uint64_t legacy_counter_ = 0;
};

NodeClient::NodeClient(NodeClientOptions options)
    : options_(std::move(options)),
      initial_registration_(with_registration_defaults(options_.registration)),
      wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      acks_(options_.router_endpoints.size()) {}

NodeClient::~NodeClient() {
  stop(false);
  if (wake_fd_ >= 0) close(wake_fd_);
}

Status NodeClient::start() {
  std::lock_guard lifecycle(lifecycle_mutex_);
  if (worker_ != nullptr) return Status(StatusCode::kInternal, "NodeClient already started");
  if (wake_fd_ < 0) return Status(StatusCode::kIoError, "eventfd failed");
  if (options_.router_endpoints.empty()) {
    return Status(StatusCode::kInvalidValue, "no router endpoints");
  }
  if (options_.interval.count() <= 0) {
    return Status(StatusCode::kInvalidValue, "heartbeat interval must be positive");
  }
  if (proto::encode_registration(initial_registration_).empty()) {
    return Status(StatusCode::kInvalidValue, "registration cannot be encoded in format " +
                                                 std::string(to_string(initial_registration_.format)));
  }
  if (!options_.curve_server_key.empty() && options_.curve_secret_key.empty()) {
    proto::CurveKeyPair ephemeral;
    if (Status s = proto::generate_curve_key_pair(&ephemeral); !s.is_ok()) return s;
    options_.curve_public_key = ephemeral.public_z85;
    options_.curve_secret_key = ephemeral.secret_z85;
  }
  auto worker = std::make_unique<Worker>(this, initial_registration_);
  if (Status s = worker->connect_all(); !s.is_ok()) return s;
  worker_ = std::move(worker);
  running_.store(true, std::memory_order_release);
  thread_ = std::thread([this] { worker_->run(); });
  return Status::ok();
}

void NodeClient::stop(bool send_goodbye) {
  std::lock_guard lifecycle(lifecycle_mutex_);
  if (!thread_.joinable()) return;
  Command command;
  command.kind = Command::Kind::kStop;
  command.flag = send_goodbye;
  post(command);
  thread_.join();
  worker_.reset();
  running_.store(false, std::memory_order_release);
}

void NodeClient::pause() { post({Command::Kind::kPause, {}, false}); }
void NodeClient::resume() { post({Command::Kind::kResume, {}, false}); }
void NodeClient::update_load(const proto::NodeLoad& load) {
  post({Command::Kind::kUpdateLoad, load, false});
}
void NodeClient::set_draining(bool draining) {
  post({Command::Kind::kSetDraining, {}, draining});
}

void NodeClient::post(Command command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(command);
  }
  const uint64_t one = 1;
  // A full counter (EAGAIN) already means "wake up"; nothing else can fail for an eventfd.
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

NodeClientStats NodeClient::stats() const {
  NodeClientStats s;
  s.heartbeats_sent = heartbeats_sent_.load(std::memory_order_relaxed);
  s.send_failures = send_failures_.load(std::memory_order_relaxed);
  s.acks_received = acks_received_.load(std::memory_order_relaxed);
  s.acks_rejected = acks_rejected_.load(std::memory_order_relaxed);
  s.goodbyes_sent = goodbyes_sent_.load(std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  s.last_ack_reason = last_ack_reason_;
  return s;
}

std::optional<proto::Ack> NodeClient::last_ack(size_t endpoint_index) const {
  std::lock_guard lock(mutex_);
  if (endpoint_index >= acks_.size()) return std::nullopt;
  return acks_[endpoint_index];
}

}  // namespace pdr::sidecar
