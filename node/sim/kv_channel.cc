#include "node/sim/kv_channel.h"

#include "proto/base/log.h"

#include "node/sim/kv_wire.h"

namespace pdr::node::sim {
namespace {

bool is_ipv6(const std::string& host) { return host.find(':') != std::string::npos; }

uint16_t port_of(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  return colon == std::string::npos ? 0
                                    : static_cast<uint16_t>(std::stoul(endpoint.substr(colon + 1)));
}

}  // namespace

std::vector<zmq::message_t> receive_frames(zmq::socket_t& socket, size_t max_frames) {
  std::vector<zmq::message_t> frames;
  while (true) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
    const bool more = frame.more();
    if (frames.size() < max_frames) frames.push_back(std::move(frame));
    if (!more) break;
  }
  return frames;
}

std::string kv_channel_endpoint(const std::string& host, uint16_t port) {
  return "tcp://" + (is_ipv6(host) ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Status KvChannelServer::bind(const std::string& host, uint16_t port, uint16_t* bound) {
  const std::string wanted = port == 0 ? "tcp://" + (is_ipv6(host) ? "[" + host + "]" : host) + ":*"
                                       : kv_channel_endpoint(host, port);
  try {
    if (!socket_) {
      socket_.emplace(context_, zmq::socket_type::router);
      socket_->set(zmq::sockopt::linger, 0);
      socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxKvMessageBytes));
      if (is_ipv6(host)) socket_->set(zmq::sockopt::ipv6, 1);
    }
    socket_->bind(wanted);
    *bound = port == 0 ? port_of(socket_->get(zmq::sockopt::last_endpoint)) : port;
  } catch (const zmq::error_t& e) {
    return Status(StatusCode::kIoError, "KV side channel: cannot bind " + wanted + ": " + e.what());
  }
  return Status::ok();
}

void KvChannelServer::start(KvChannelHandlers handlers) {
  handlers_ = std::move(handlers);
  thread_ = std::thread([this] { run(); });
}

void KvChannelServer::stop() {
  stopping_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  socket_.reset();
}

void KvChannelServer::run() {
  auto next_tick = std::chrono::steady_clock::now() + handlers_.tick;
  while (!stopping_.load(std::memory_order_acquire)) {
    zmq::pollitem_t items[2] = {{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0},
                                {nullptr, handlers_.watch_fd, ZMQ_POLLIN, 0}};
    const int count = handlers_.watch_fd >= 0 ? 2 : 1;
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(
        next_tick - std::chrono::steady_clock::now());
    try {
      zmq::poll(items, count, std::chrono::milliseconds(std::max<int64_t>(0, wait.count())));
      if (items[0].revents & ZMQ_POLLIN) {
        std::vector<zmq::message_t> frames = receive_frames(*socket_, 4);
        if (frames.size() != 3 || frames[1].size() != 0) {
          bad_envelopes_.fetch_add(1, std::memory_order_relaxed);
        } else {
          std::string reply = handlers_.on_request(frames[2].to_string_view());
          socket_->send(frames[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          socket_->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          socket_->send(zmq::buffer(reply), zmq::send_flags::dontwait);
        }
      }
      if (count == 2 && (items[1].revents & ZMQ_POLLIN) && handlers_.on_watch_fd) {
        handlers_.on_watch_fd();
      }
    } catch (const zmq::error_t& e) {
      pdr::log::warn("sim KV side channel: {}", e.what());
    }
    if (std::chrono::steady_clock::now() >= next_tick) {
      if (handlers_.on_tick) handlers_.on_tick();
      next_tick = std::chrono::steady_clock::now() + handlers_.tick;
    }
  }
}

std::optional<std::string> kv_channel_call(zmq::context_t& context, const std::string& host,
                                           uint16_t port, std::string_view request,
                                           std::chrono::steady_clock::time_point deadline,
                                           std::string* reply,
                                           const std::function<bool()>& abandon) {
  const std::string endpoint = kv_channel_endpoint(host, port);
  try {
    zmq::socket_t socket(context, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxKvMessageBytes));
    if (is_ipv6(host)) socket.set(zmq::sockopt::ipv6, 1);
    socket.connect(endpoint);
    socket.send(zmq::message_t(), zmq::send_flags::sndmore);
    socket.send(zmq::buffer(request.data(), request.size()), zmq::send_flags::none);
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return "no reply from " + endpoint + " before the deadline";
      if (abandon && abandon()) return "call to " + endpoint + " abandoned";
      zmq::pollitem_t item{static_cast<void*>(socket), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, abandon ? std::min(left, kKvCallSlice) : left);
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames = receive_frames(socket, 3);
      if (frames.size() != 2 || frames[0].size() != 0) return "bad reply envelope from " + endpoint;
      reply->assign(frames[1].to_string_view());
      return std::nullopt;
    }
  } catch (const zmq::error_t& e) {
    return endpoint + ": " + e.what();
  }
}

}  // namespace pdr::node::sim
