// The `pdnode sim` KV side channel transport: request/reply over ZMQ (node/sim/kv_wire.h holds
// the messages).
//
// KvChannelServer: one ROUTER socket bound on every requested endpoint (a dialect may need several
// ports: NIXL/Mooncake advertise one per DP rank), served by one thread that also wakes up when
// `watch_fd` is readable (the engine's notification eventfd) and at least every `tick` (to see
// stop(), and to run on_tick if set). Incoming messages over kMaxKvMessageBytes are dropped by ZMQ
// (ZMQ_MAXMSGSIZE); envelopes that are not [identity][empty][payload] are dropped and counted.
// The handler runs on the server thread and returns the reply payload; it must not block for long.
//
// kv_channel_call(): one request on a fresh DEALER socket (so a timed-out call leaves no state
// behind), with a deadline; thread-safe given a shared zmq context.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "proto/base/status.h"

namespace pdr::node::sim {

struct KvChannelHandlers {
  std::function<std::string(std::string_view request)> on_request;
  int watch_fd = -1;                    // optional: readable -> on_watch_fd()
  std::function<void()> on_watch_fd;
  std::function<void()> on_tick;        // optional, every `tick`
  std::chrono::milliseconds tick{50};
};

class KvChannelServer {
 public:
  explicit KvChannelServer(zmq::context_t& context) : context_(context) {}
  ~KvChannelServer() { stop(); }
  KvChannelServer(const KvChannelServer&) = delete;
  KvChannelServer& operator=(const KvChannelServer&) = delete;

  // Binds host:port (0: an ephemeral port) and returns the bound port in *bound; call before
  // start(), as often as needed. kIoError naming the address on failure.
  Status bind(const std::string& host, uint16_t port, uint16_t* bound);
  // Starts serving every bound endpoint on the thread.
  void start(KvChannelHandlers handlers);
  void stop();  // idempotent; joins the thread
  uint64_t bad_envelopes() const { return bad_envelopes_.load(std::memory_order_relaxed); }

 private:
  void run();

  zmq::context_t& context_;
  std::optional<zmq::socket_t> socket_;
  KvChannelHandlers handlers_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> bad_envelopes_{0};
  std::thread thread_;
};

// Reads the rest of one multipart message without blocking, keeping at most `max_frames` frames
// (extra frames are read and dropped, so a bad envelope cannot desynchronise the socket).
std::vector<zmq::message_t> receive_frames(zmq::socket_t& socket, size_t max_frames);

// "tcp://HOST:PORT" with IPv6 hosts bracketed.
std::string kv_channel_endpoint(const std::string& host, uint16_t port);

// Sends `request` to host:port and waits until `deadline` for the reply. nullopt and *reply set
// on success; else why it failed ("no reply from tcp://...: deadline passed"). `abandon`, when
// set, is asked at least every kKvCallSlice while waiting: true ends the call at once
// ("abandoned"), so a node that is stopping, or whose request ended, does not sit out a peer
// that died without answering.
inline constexpr std::chrono::milliseconds kKvCallSlice{50};
std::optional<std::string> kv_channel_call(zmq::context_t& context, const std::string& host,
                                           uint16_t port, std::string_view request,
                                           std::chrono::steady_clock::time_point deadline,
                                           std::string* reply,
                                           const std::function<bool()>& abandon = {});

}  // namespace pdr::node::sim
