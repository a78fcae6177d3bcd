// Lane: one outgoing connection to a peer, the initiator side of the protocol (T-2, T-6, T-9,
// T-10). It waits for the server's CHALLENGE, answers with HELLO (our agent name and an HMAC of the
// nonce keyed by the peer's descriptor secret, proto/transfer_frame.h), then sends WRITE / READ_REQ
// / NOTIFY frames for the batches it is given, in order, and matches the peer's ACK / READ_DATA / ERROR answers to them in the same order (the
// serving side answers a connection's requests in the order it read them).
//
// Threads: created by the backend, then owned and used by exactly one IoThread; every method runs
// on that thread.
//
// States: idle (no socket) -> connecting -> handshake (connected, waiting for CHALLENGE) -> ready;
// a failed attempt (no connection, or closed / no CHALLENGE within connect_timeout) -> backoff
// (50 ms doubling to 2 s, reset by a success), retried while work waits; an established connection
// that drops (e.g. the peer refused our proof), or a peer that breaks the protocol, fails the
// lane's batches and goes back to idle, so the next submit reconnects. Work queued while not ready
// fails kPeerGone after options.connect_timeout.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transfer/tcp/frame_io.h"
#include "transfer/tcp/ring_queue.h"
#include "transfer/tcp/shared_state.h"
#include "transfer/net/tcp_socket.h"
#include "transfer/tcp/task_state.h"

namespace pdr::transfer::tcp {

class IoThread;

class Lane final : public Connection {
 public:
  // `secret`: the peer's descriptor secret (proto::kTransferSecretBytes), the HELLO proof's key.
  Lane(IoThread& thread, const Shared& shared, const SocketAddress& address, std::string secret);
  ~Lane() override;  // closes the socket; call fail_all() first if batches may remain
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // Queues a batch (the lane takes one reference); connects if needed.
  void submit(Batch* batch);
  // Settles every batch of xfer_id with `cause`; late answers for it are discarded.
  void cancel(std::uint64_t xfer_id, XferCause cause);
  // Closes the socket and settles everything with `cause` (peer removed, backend stopping).
  void fail_all(XferCause cause);

  void on_events(std::uint32_t events) override;
  // The next time on_timer() has something to do, or time_point::max().
  Clock::time_point next_deadline() const;
  void on_timer(Clock::time_point now);

 private:
  enum class State : std::uint8_t { kIdle, kConnecting, kHandshake, kReady, kBackoff };

  struct Expect {  // one answer the peer owes us
    Batch* batch = nullptr;
    std::uint32_t segment = 0;
    std::uint64_t length = 0;  // READ_DATA payload expected
  };
  struct OutFrame {  // a frame staged for writing
    HeaderBytes header{};
    std::size_t header_sent = 0;
    const std::byte* payload = nullptr;
    std::uint64_t payload_left = 0;
    Batch* batch = nullptr;    // holds a reference; null for HELLO
    bool from_memory = false;  // payload is the task's memory: zeros once the batch settled
    bool active = false;
  };

  void connect();
  void on_connected();
  void connect_failed();
  void read_challenge();  // kHandshake: the CHALLENGE header and nonce; then HELLO and kReady
  void expire_waiting(Clock::time_point now);
  void close_socket();
  void connection_lost(XferCause cause, bool count_disconnect);
  void fail_everything(XferCause cause);
  void set_write_interest(bool on);

  OutFrame& stage_slot();       // the next free staged slot, reset
  bool stage_next_frame();      // stages the next frame of queue_; false when there is none
  void flush();
  void read_frames();
  bool on_header();  // false: protocol violation (lane already failed)
  void on_payload_done();
  void protocol_error();

  IoThread& thread_;
  const Shared& shared_;
  const SocketAddress address_;
  int fd_ = -1;
  State state_ = State::kIdle;
  bool write_interest_ = false;
  Clock::time_point connect_started_{};
  Clock::time_point next_attempt_{};
  std::chrono::milliseconds backoff_{50};

  RingQueue<Batch*> queue_;     // batches with frames still to send, oldest first
  RingQueue<Expect> expects_;   // answers owed, in wire order
  // Frames staged for the socket, oldest first: several small frames go out in one sendmsg (T-4).
  static constexpr std::size_t kMaxStaged = 16;
  OutFrame staged_[kMaxStaged];
  std::size_t staged_head_ = 0;
  std::size_t staged_count_ = 0;
  OutFrame& staged(std::size_t i) { return staged_[(staged_head_ + i) % kMaxStaged]; }
  const std::string secret_;      // the peer's secret: HMAC key of our HELLO proof
  std::vector<std::byte> hello_;  // HELLO payload (proof + our agent name), built per connection
  std::array<std::byte, proto::kTransferNonceBytes> nonce_{};
  std::size_t nonce_got_ = 0;

  HeaderBytes in_header_{};
  std::size_t in_header_got_ = 0;
  proto::TransferFrameHeader in_{};
  bool in_payload_ = false;
  std::byte* in_dst_ = nullptr;
  std::uint64_t in_left_ = 0;
  std::vector<std::byte> scratch_;  // where answers for settled batches are drained
};

}  // namespace pdr::transfer::tcp
