// The ceilings `pdnode xfer-bench` compares the engine against: a plain blocking TCP socket pair on
// loopback (one stream, the same message sizes) and memcpy. Deliberately naive and obviously
// correct: no epoll, no framing beyond an 8-byte length, so nothing of ours can slow it down.
//
// Raw protocol: the client sends u64 little-endian N and u64 C (its send unit), then N bytes; the
// sink reads them into a scratch buffer of C bytes (4 KiB..16 MiB) and answers one byte. A "round
// trip" is one such message.
#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "proto/base/status.h"

namespace pdr::node::xfer_bench {

// Accepts connections on 127.0.0.1:<ephemeral> and serves each with the protocol above on its own
// thread until the peer closes. Runs until destroyed.
class RawSink {
 public:
  RawSink() = default;
  RawSink(const RawSink&) = delete;
  RawSink& operator=(const RawSink&) = delete;
  ~RawSink();
  Status start();
  std::uint16_t port() const { return port_; }

 private:
  void accept_loop();
  int listen_fd_ = -1;
  std::uint16_t port_ = 0;
  std::thread acceptor_;
  std::vector<std::thread> connections_;
};

class RawClient {
 public:
  RawClient() = default;
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;
  ~RawClient();
  Status connect(std::uint16_t port);
  // Sends `total` bytes as one message, in send() calls of `chunk` bytes, and waits for the ack.
  Status send_message(std::uint64_t total, std::uint64_t chunk);

 private:
  int fd_ = -1;
  std::vector<std::byte> buffer_;
};

}  // namespace pdr::node::xfer_bench
