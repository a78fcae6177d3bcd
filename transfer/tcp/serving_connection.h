// ServingConnection: one accepted connection, the serving side of the protocol. It first sends
// CHALLENGE (a fresh random nonce) and expects HELLO: a proof, HMAC-SHA256 keyed by our engine's
// secret over the nonce and the peer's agent name (proto/transfer_frame.h), verified in constant
// time, then the agent name (for on_notification). Until that proof checks out nothing but the
// HELLO is read and nothing is answered; a wrong or missing proof, or any other frame first, closes
// the connection with nothing sent back (auth_failures), and so does the hello_timeout running out
// (hello_timeouts, driven by the IoThread through on_timer()). After it, it applies WRITE frames straight into
// registered memory, answers READ_REQ with READ_DATA sent straight from registered memory, delivers
// NOTIFY, and answers in the order it read the requests.
//
// Safety (backend.h "Serving side"): every (region, offset, length) is checked with
// context.regions->resolve() before a byte moves, and a device region (MemKind::kDevice, an opaque
// address that is no host pointer) is refused like an out-of-bounds one. A refused WRITE has its payload drained into
// scratch (the stream stays in sync) and its ACK replaced by ERROR(kAccess); a refused READ_REQ is
// answered by ERROR(kAccess); both count access_refused. A header that does not decode, a frame
// above max_frame_payload, a second HELLO, an oversized NOTIFY or an opcode a client must not send
// counts bad_frames and closes this connection only.
//
// Memory: before authentication a connection holds its small fixed state and at most one HELLO
// payload (32 + max_agent_bytes); the 256 KiB drain buffer is allocated on the first refused WRITE
// (scratch_allocations() counts those allocations, process-wide, for tests).
//
// Region fence (region_table.h Lifetime): a WRITE payload is received, and a
// READ_DATA payload sent, with its region pinned around each recv/send only; a region unregistered
// mid-WRITE has the rest of the payload drained (ACK -> ERROR(kAccess), counted access_refused), a
// queued READ_DATA whose region went away is answered ERROR(kAccess) instead, or, if it was already
// half sent, closes the connection.
//
// Backpressure: a client that sends requests but does not read the answers makes this side stop
// reading once kMaxQueuedResponses answers wait, and resume when half of them went out, so the
// answer queue stays bounded.
//
// Threads: owned and used by one IoThread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "transfer/tcp/frame_io.h"
#include "transfer/tcp/ring_queue.h"
#include "transfer/tcp/shared_state.h"

namespace pdr::transfer::tcp {

class IoThread;

class ServingConnection final : public Connection {
 public:
  // Takes ownership of the connected, non-blocking fd (already counted in
  // shared.serving_connections); start() watches it and sends the CHALLENGE.
  ServingConnection(IoThread& thread, const Shared& shared, int fd);
  ~ServingConnection() override;
  ServingConnection(const ServingConnection&) = delete;
  ServingConnection& operator=(const ServingConnection&) = delete;

  void start();
  void on_events(std::uint32_t events) override;
  bool closed() const { return fd_ < 0; }
  bool authenticated() const { return said_hello_; }
  // time_point::max() once authenticated; else when on_timer() closes an unauthenticated peer.
  Clock::time_point hello_deadline() const;
  void on_timer(Clock::time_point now);
  // How many 256 KiB drain buffers serving connections allocated so far in this process.
  static std::uint64_t scratch_allocations();
  // Closes the socket without counting anything (backend stopping).
  void shutdown();

 private:
  enum class Sink : std::uint8_t { kMemory, kDiscard, kAgent, kNotify };
  enum class CloseReason : std::uint8_t { kLost, kBadFrame, kAuthFailed, kHelloTimeout };
  struct Response {
    HeaderBytes header{};
    const std::byte* payload = nullptr;  // READ_DATA: registered memory
    std::uint64_t length = 0;
    std::uint64_t xfer_id = 0;  // of the request; with region/offset, to re-pin the payload
    RegionId region = kInvalidRegion;
    std::uint64_t offset = 0;
    bool from_region = false;  // READ_DATA: payload is registered memory, pinned for each send
  };

  void read_frames();
  bool on_header();  // false: bad frame
  // Pins the rest of the current WRITE payload's target; false (and the frame switched to draining,
  // refused) when its region was unregistered meanwhile.
  bool pin_write_target(std::byte** into);
  void on_payload_done();
  void respond(proto::FrameOpcode opcode, std::uint32_t flags, const proto::TransferFrameHeader& request,
               const std::byte* payload, std::uint64_t length);
  void flush();
  void set_write_interest(bool on);
  void update_interest();
  void close_connection(CloseReason reason);
  bool verify_hello();  // notify_ holds the HELLO payload; true: said_hello_ and peer_agent_ set
  // resolve() for a peer's request; device regions are refused (no host pointer to copy from/to).
  Status resolve_host(std::byte** out) const;

  IoThread& thread_;
  const Shared& shared_;
  int fd_;
  bool write_interest_ = false;
  bool reading_paused_ = false;
  std::uint32_t watched_ = 0;  // the epoll events currently registered  // too many answers queued: stop reading until they drain
  bool said_hello_ = false;  // the peer proved it holds our secret
  std::string peer_agent_;
  Clock::time_point hello_deadline_;
  std::array<std::byte, proto::kTransferNonceBytes> nonce_{};  // CHALLENGE payload

  HeaderBytes in_header_{};
  std::size_t in_header_got_ = 0;
  proto::TransferFrameHeader in_{};
  bool in_payload_ = false;
  Sink sink_ = Sink::kDiscard;
  std::byte* in_dst_ = nullptr;
  std::uint64_t in_left_ = 0;
  std::uint64_t in_pos_ = 0;  // bytes of the current payload received
  std::string notify_;        // kAgent / kNotify payload
  bool write_refused_ = false;
  std::uint64_t refused_xfer_ = 0;  // a WRITE of this xfer was refused: its ACK becomes ERROR
  std::vector<std::byte> scratch_;  // drain buffer for refused WRITEs; empty until one needs it

  RingQueue<Response> responses_;
  std::size_t front_sent_ = 0;  // bytes of responses_.front() (header + payload) already sent
};

}  // namespace pdr::transfer::tcp
