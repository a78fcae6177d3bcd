#include "node/sim/kv_events_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "proto/base/log.h"
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "proto/kv_events.h"

namespace pdr::node::sim {
namespace {

// A replay request is a few bytes; nothing bigger is read from the ROUTER.
constexpr int64_t kMaxReplayRequestBytes = 256;
constexpr size_t kMaxReplayRequestsPerWake = 64;

// `port` empty: "*", an ephemeral port.
std::string endpoint(const std::string& host, const std::string& port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + (port.empty() ? "*" : port);
}

uint16_t bound_port(zmq::socket_t& socket) {
  const std::string last = socket.get(zmq::sockopt::last_endpoint);
  return static_cast<uint16_t>(std::stoul(last.substr(last.rfind(':') + 1)));
}

}  // namespace

class SimKvEventsPublisher::Impl {
 public:
  ~Impl() { stop(); }

  Status start(const SimKvEventsPublisherOptions& options) {
    options_ = options;
    options_.ranks = std::max<uint32_t>(1, options_.ranks);
    context_ = std::make_unique<zmq::context_t>(1);
    try {
      bind_all();
    } catch (const zmq::error_t& e) {
      return failed(std::string("KV events publisher: ") + e.what());
    }
    if (ports_.size() < options_.ranks) {
      return failed("KV events publisher: a DP rank's port would be beyond 65535");
    }
    next_seq_.assign(options_.ranks, 0);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status(StatusCode::kIoError, "eventfd failed");
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_ = true;
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  // Binds every rank's sockets, kept in ranks_ at once so a failure closes them all before the
  // context. Stops short (ports_ shorter than ranks) when a rank's port would be beyond 65535;
  // throws zmq::error_t.
  void bind_all() {
    for (uint32_t r = 0; r < options_.ranks; ++r) {
      Rank& rank = ranks_.emplace_back();
      rank.pub = zmq::socket_t(*context_, zmq::socket_type::pub);
      rank.pub.set(zmq::sockopt::linger, 0);
      rank.pub.set(zmq::sockopt::sndhwm, options_.sndhwm);
      if (options_.host.find(':') != std::string::npos) rank.pub.set(zmq::sockopt::ipv6, 1);
      if (!bind(rank.pub, options_.port, r, &ports_)) return;
      if (options_.replay_port) {
        rank.router = zmq::socket_t(*context_, zmq::socket_type::router);
        rank.router->set(zmq::sockopt::linger, 0);
        rank.router->set(zmq::sockopt::maxmsgsize, kMaxReplayRequestBytes);
        if (options_.host.find(':') != std::string::npos) rank.router->set(zmq::sockopt::ipv6, 1);
        if (!bind(*rank.router, *options_.replay_port, r, &replay_ports_)) {
          ports_.pop_back();
          return;
        }
      }
    }
  }

  Status failed(std::string message) {
    ranks_.clear();
    context_.reset();
    ports_.clear();
    replay_ports_.clear();
    return Status(StatusCode::kIoError, std::move(message));
  }

  void stop() {
    if (!thread_.joinable()) return;
    {
      // No publish() gets past its check (nor touches wake_fd_) from here on.
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      running_ = false;
    }
    wake();
    thread_.join();
    ranks_.clear();
    context_.reset();
    ::close(wake_fd_);
    wake_fd_ = -1;
  }

  const std::vector<uint16_t>& ports() const { return ports_; }
  const std::vector<uint16_t>& replay_ports() const { return replay_ports_; }

  void publish(uint32_t rank, std::string payload) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!running_ || rank >= options_.ranks || queue_.size() >= options_.max_queue ||
          queue_bytes_ + payload.size() > options_.max_queue_bytes) {
        ++dropped_;
        return;
      }
      queue_bytes_ += payload.size();
      queue_.push_back({rank, std::move(payload)});
      wake();  // under mu_: stop() closes wake_fd_ only after running_ is false
    }
  }

  void withhold(uint32_t batches) {
    std::lock_guard<std::mutex> lock(mu_);
    withhold_ += batches;
  }

  nlohmann::json stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return nlohmann::json{{"published", published_},
                          {"dropped", dropped_},
                          {"withheld", withheld_},
                          {"replay_requests", replay_requests_},
                          {"replayed_batches", replayed_batches_},
                          {"bad_replay_requests", bad_replay_requests_},
                          {"next_seq", next_seq_},
                          {"ports", ports_},
                          {"replay_ports", replay_ports_}};
  }

 private:
  struct Rank {
    zmq::socket_t pub;
    std::optional<zmq::socket_t> router;
    std::deque<std::pair<uint64_t, std::string>> buffer;  // (seq, payload), oldest first
    size_t buffer_bytes = 0;
  };
  struct Queued {
    uint32_t rank = 0;
    std::string payload;
  };

  // Rank r binds `port` + r, as vLLM's publishers do, or with `port` 0 an ephemeral port of its
  // own: an ephemeral base plus r may be any other process's port, so only the kernel can hand
  // out ports that cannot collide. Appends the bound port to *bound; false when `port` + r is
  // beyond 65535.
  bool bind(zmq::socket_t& socket, uint16_t port, uint32_t r, std::vector<uint16_t>* bound) {
    if (port != 0 && uint32_t{port} + r > 65535) return false;
    socket.bind(endpoint(options_.host, port == 0 ? "" : std::to_string(port + r)));
    bound->push_back(bound_port(socket));
    return true;
  }

  void wake() {
    const uint64_t one = 1;
    if (wake_fd_ >= 0) [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  void run() {
    std::vector<zmq::pollitem_t> items;
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    std::vector<uint32_t> item_rank;
    for (uint32_t r = 0; r < ranks_.size(); ++r) {
      if (ranks_[r].router) {
        items.push_back({ranks_[r].router->handle(), 0, ZMQ_POLLIN, 0});
        item_rank.push_back(r);
      }
    }
    for (;;) {
      try {
        zmq::poll(items.data(), items.size(), std::chrono::milliseconds(-1));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        pdr::log::error("KV events publisher: poll: {}", e.what());
        return;
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count = 0;
        [[maybe_unused]] auto n = ::read(wake_fd_, &count, sizeof(count));
        std::deque<Queued> batch;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (stopping_) return;
          batch.swap(queue_);
          queue_bytes_ = 0;
        }
        for (Queued& q : batch) send(q.rank, std::move(q.payload));
      }
      for (size_t i = 1; i < items.size(); ++i) {
        if (items[i].revents & ZMQ_POLLIN) answer_replays(item_rank[i - 1]);
      }
    }
  }

  void send(uint32_t r, std::string payload) {
    Rank& rank = ranks_[r];
    uint64_t seq = 0;
    bool hold = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seq = next_seq_[r]++;
      if (withhold_ > 0) {
        --withhold_;
        ++withheld_;
        hold = true;
      }
    }
    rank.buffer_bytes += payload.size();
    rank.buffer.emplace_back(seq, std::move(payload));
    while (rank.buffer.size() > options_.buffer_steps ||
           (rank.buffer.size() > 1 && rank.buffer_bytes > options_.buffer_bytes)) {
      rank.buffer_bytes -= rank.buffer.front().second.size();
      rank.buffer.pop_front();
    }
    if (hold) return;
    const std::string& body = rank.buffer.back().second;
    const std::string seq_frame = proto::encode_kv_event_seq(seq);
    bool sent = false;
    try {
      sent = rank.pub.send(zmq::buffer(options_.topic), zmq::send_flags::sndmore |
                                                            zmq::send_flags::dontwait)
                 .has_value() &&
             rank.pub.send(zmq::buffer(seq_frame),
                           zmq::send_flags::sndmore | zmq::send_flags::dontwait)
                 .has_value() &&
             rank.pub.send(zmq::buffer(body), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      pdr::log::debug("KV events publisher: send: {}", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++(sent ? published_ : dropped_);
  }

  void answer_replays(uint32_t r) {
    Rank& rank = ranks_[r];
    for (size_t n = 0; n < kMaxReplayRequestsPerWake; ++n) {
      std::vector<zmq::message_t> frames;
      try {
        if (!zmq::recv_multipart(*rank.router, std::back_inserter(frames),
                                 zmq::recv_flags::dontwait)) {
          return;
        }
      } catch (const zmq::error_t& e) {
        pdr::log::debug("KV events publisher: replay recv: {}", e.what());
        return;
      }
      uint64_t start = 0;
      if (frames.size() != 3 || frames[1].size() != 0 ||
          !proto::decode_kv_event_seq(
              {static_cast<const std::byte*>(frames[2].data()), frames[2].size()}, &start)) {
        std::lock_guard<std::mutex> lock(mu_);
        ++bad_replay_requests_;
        continue;
      }
      const std::string id = frames[0].to_string();
      uint64_t replayed = 0;
      try {
        const std::optional<std::string> topic =
            options_.replay_with_topic ? std::optional<std::string>(options_.topic) : std::nullopt;
        for (const auto& [seq, payload] : rank.buffer) {
          if (seq < start) continue;
          const std::string seq_frame = proto::encode_kv_event_seq(seq);
          reply(*rank.router, id, topic, seq_frame, payload);
          ++replayed;
        }
        // vLLM's end marker leaves the topic frame empty.
        reply(*rank.router, id, topic ? std::optional<std::string>("") : std::nullopt,
              proto::encode_kv_event_seq(proto::kKvReplayEnd), "");
      } catch (const zmq::error_t& e) {
        pdr::log::debug("KV events publisher: replay send: {}", e.what());
      }
      std::lock_guard<std::mutex> lock(mu_);
      ++replay_requests_;
      replayed_batches_ += replayed;
    }
  }

  // A ROUTER drops what it cannot queue for a peer instead of blocking (ROUTER_MANDATORY off).
  // `topic` unset: the layout without the topic frame.
  static void reply(zmq::socket_t& router, const std::string& id,
                    const std::optional<std::string>& topic, const std::string& seq,
                    const std::string& payload) {
    router.send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    if (topic) router.send(zmq::buffer(*topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router.send(zmq::buffer(seq), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  }

  SimKvEventsPublisherOptions options_;
  std::unique_ptr<zmq::context_t> context_;
  std::vector<Rank> ranks_;  // the thread's, once started
  std::vector<uint16_t> ports_;         // each rank's bound PUB port
  std::vector<uint16_t> replay_ports_;  // each rank's bound ROUTER port (none without replay)
  int wake_fd_ = -1;
  std::thread thread_;

  mutable std::mutex mu_;
  bool running_ = false;
  bool stopping_ = false;
  std::deque<Queued> queue_;
  size_t queue_bytes_ = 0;
  uint32_t withhold_ = 0;
  std::vector<uint64_t> next_seq_;
  uint64_t published_ = 0;
  uint64_t dropped_ = 0;
  uint64_t withheld_ = 0;
  uint64_t replay_requests_ = 0;
  uint64_t replayed_batches_ = 0;
  uint64_t bad_replay_requests_ = 0;
};

SimKvEventsPublisher::SimKvEventsPublisher() : impl_(std::make_unique<Impl>()) {}
SimKvEventsPublisher::~SimKvEventsPublisher() { stop(); }
Status SimKvEventsPublisher::start(const SimKvEventsPublisherOptions& options) {
  return impl_->start(options);
}
void SimKvEventsPublisher::stop() { impl_->stop(); }
const std::vector<uint16_t>& SimKvEventsPublisher::ports() const { return impl_->ports(); }
const std::vector<uint16_t>& SimKvEventsPublisher::replay_ports() const {
  return impl_->replay_ports();
}
void SimKvEventsPublisher::publish(uint32_t rank, std::string payload) {
  impl_->publish(rank, std::move(payload));
}
void SimKvEventsPublisher::withhold(uint32_t batches) { impl_->withhold(batches); }
nlohmann::json SimKvEventsPublisher::stats() const { return impl_->stats(); }

}  // namespace pdr::node::sim
