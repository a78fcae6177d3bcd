// Backend: the one interface every transport (tcp/, shm/, rdma/) implements for the Engine
// (transfer/engine.h). The engine owns validation, coalescing, deadlines, cancellation requests and
// the notification queue; a backend only moves already-checked segments to one peer and reports
// how each transfer ended.
//
// Contract (every backend, checked by the shared engine suite in tests/transfer/):
// - start() runs once before anything else; stop() once at the end (the destructor may also run
//   without start()). After stop() returns, no callback into the engine happens any more and every
//   task that was submitted has been finished.
// - submit() returning ok means task->finish() will be called exactly once, from any thread,
//   possibly before submit() returns. submit() returning an error means finish() is never called
//   for that task. submit() never blocks on the network.
// - After finish(), the backend never touches the task nor the task's local memory again (a READ
//   answer arriving late for a finished task is discarded, not written into the caller's memory).
// - cancel(xfer_id) asks for a prompt finish() with task->cancel_cause() (kCancelled or kTimeout,
//   set by the engine before the call). It must not call finish() inline (the engine may hold
//   locks); it is a no-op for an id the backend no longer holds. A task that is already complete
//   on the wire may still finish as kDone.
// - Ordering: task->notify (if non-empty) reaches the peer's on_notification only after every byte
//   of the task's segments is visible in the destination memory (WRITE: the peer applied them; READ:
//   they landed locally). A task with no segments is a bare notification.
// - Peer loss: every in-flight task to that peer finishes kFailed/kPeerGone. Network backends
//   reconnect on the next submit (with backoff inside the backend); a backend whose peer address
//   dies with the peer process (shm's socket name) keeps failing kPeerGone until the application
//   re-imports the restarted peer's descriptor.
// - Serving side: every (region, offset, length) a peer names is checked with
//   context.regions->resolve() before a byte moves, and the memory is touched only under
//   context.regions->pin() held for one bounded step (region_table.h Lifetime), so that
//   Engine::unregister_region() can fence the region off; a refused request answers the peer with an
//   error (its task fails kAccess) and counts access_refused; a frame that does not decode counts
//   bad_frames and closes that connection only. A backend whose serving side sees requests (tcp)
//   first makes the peer prove it holds context.secret (i.e. was given our descriptor) and serves
//   nothing before that. One-sided transports (RDMA) never show the request
//   to the target's CPU: there the memory registration, sized to exactly the region, is the check
//   (the initiator's task fails kAccess), and access_refused / bytes_served count only what the
//   backend can see.
// - Cancel latency: "prompt" is bounded by what the transport can recall. A posted RDMA operation
//   cannot be; against a dead peer its cancel completes after the transport's retry timeout
//   (~0.5 s with R-4's values) unless the connection is torn down.
// - Limits both ends rely on: notify messages <= 4096 bytes (EngineOptions and each backend's
//   options), agent names <= 256 bytes (descriptor limit).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "proto/transfer_descriptor.h"
#include "transfer/core/region_table.h"
#include "transfer/core/xfer_types.h"

namespace pdr::transfer {

enum class BackendKind : std::uint8_t { kTcp = 0, kShm, kRdma };
std::string_view backend_kind_label(BackendKind kind);  // "tcp", "shm", "rdma"
proto::EndpointBackend endpoint_backend(BackendKind kind);

using PeerId = std::uint32_t;
inline constexpr PeerId kInvalidPeer = 0;

// Engine-wide counters (relaxed atomics; monotonically increasing). Backends update the ones they
// observe; the engine exports them all.
struct EngineCounters {
  std::atomic<std::uint64_t> xfers_submitted{0};
  std::atomic<std::uint64_t> xfers_done{0};
  std::atomic<std::uint64_t> xfers_failed{0};
  std::atomic<std::uint64_t> xfers_cancelled{0};  // by cancel() or deadline
  std::atomic<std::uint64_t> bytes_written{0};    // initiator: WRITE payload acknowledged by peers
  std::atomic<std::uint64_t> bytes_read{0};       // initiator: READ payload landed locally
  std::atomic<std::uint64_t> bytes_served{0};     // target: payload peers wrote into / read from us
  std::atomic<std::uint64_t> bad_frames{0};       // refused undecodable frames (connection closed)
  std::atomic<std::uint64_t> access_refused{0};   // refused out-of-bounds peer requests
  // Serving connections closed before the peer proved it holds our descriptor's secret: a missing
  // or wrong HELLO proof, or any other frame first (auth_failures); no HELLO within the backend's
  // deadline (hello_timeouts); over the backend's connection cap at accept (connections_refused).
  std::atomic<std::uint64_t> auth_failures{0};
  std::atomic<std::uint64_t> hello_timeouts{0};
  std::atomic<std::uint64_t> connections_refused{0};
  std::atomic<std::uint64_t> connects{0};         // outgoing connections established
  std::atomic<std::uint64_t> connect_failures{0};
  std::atomic<std::uint64_t> disconnects{0};      // established connections lost (either side)
  std::atomic<std::uint64_t> notifications_sent{0};
  std::atomic<std::uint64_t> notifications_received{0};
  // shm: local connections closed unanswered because the peer's uid (SO_PEERCRED) is not allowed
  // (ShmBackendOptions::allowed_uids), either side.
  std::atomic<std::uint64_t> shm_peers_refused{0};
};

// What a backend may use of its engine. Valid from start() until stop() returns.
struct BackendContext {
  std::string agent;               // the local agent name (identifies us to peers)
  // The engine's random per-engine secret (proto::kTransferSecretBytes raw bytes), also published
  // in its descriptor. A serving side that sees requests (tcp) serves only peers that prove they
  // know it; trust model in tcp/tcp_backend.h.
  std::string secret;
  const RegionTable* regions = nullptr;
  EngineCounters* counters = nullptr;
  // Delivers a notification a peer sent us. Thread-safe, never blocks for long; `from` is the
  // peer's agent name as it introduced itself.
  std::function<void(std::string_view from, std::string_view message)> on_notification;
  // The memfd behind a region allocated by Engine::allocate_region(), or -1 for memory the caller
  // registered (the shm backend shares memfd regions by fd and falls back to cross-memory attach).
  // Such a memfd maps the region from file offset 0 for exactly its length, sealed at that size.
  std::function<int(RegionId)> region_fd;
};

// One coalesced piece of a transfer. The engine has bounds-checked the local side (local_addr is
// resolved) and checked the remote side against the peer's descriptor; the peer checks it again.
struct XferSegment {
  RegionId local_region = kInvalidRegion;
  std::uint64_t local_offset = 0;
  std::byte* local_addr = nullptr;
  RegionId remote_region = kInvalidRegion;  // the peer's RegionId, as in its descriptor
  std::uint64_t remote_offset = 0;
  std::uint64_t length = 0;
};

// A transfer handed to a backend. Owned by the engine; valid from submit() until finish().
class XferTask {
 public:
  using FinishFn = void (*)(void* owner, XferTask* task, const XferResult& result);

  XferTask(std::uint64_t id, XferOp op, PeerId peer, FinishFn finish_fn, void* owner)
      : id_(id), op_(op), peer_(peer), finish_fn_(finish_fn), owner_(owner) {}
  XferTask(const XferTask&) = delete;
  XferTask& operator=(const XferTask&) = delete;

  std::uint64_t id() const { return id_; }  // unique per engine, never 0; use it as the wire xfer_id
  XferOp op() const { return op_; }
  PeerId peer() const { return peer_; }
  std::span<const XferSegment> segments() const { return segments_; }
  std::uint64_t total_bytes() const { return total_bytes_; }
  const std::string& notify() const { return notify_; }  // empty: no notification

  // kNone until the engine asks for a cancel (then kCancelled or kTimeout).
  XferCause cancel_cause() const { return cancel_cause_.load(std::memory_order_acquire); }

  // Called by the backend exactly once. The task is freed during the call: do not touch it after.
  void finish(const XferResult& result) { finish_fn_(owner_, this, result); }

  // ---- engine side ----
  std::vector<XferSegment>& mutable_segments() { return segments_; }
  void set_total_bytes(std::uint64_t bytes) { total_bytes_ = bytes; }
  void set_notify(std::string_view message) { notify_.assign(message); }
  // First cause wins; returns false when a cancel was already requested.
  bool request_cancel(XferCause cause) {
    XferCause expected = XferCause::kNone;
    return cancel_cause_.compare_exchange_strong(expected, cause, std::memory_order_acq_rel);
  }

 private:
  const std::uint64_t id_;
  const XferOp op_;
  const PeerId peer_;
  FinishFn finish_fn_;
  void* owner_;
  std::vector<XferSegment> segments_;
  std::uint64_t total_bytes_ = 0;
  std::string notify_;
  std::atomic<XferCause> cancel_cause_{XferCause::kNone};
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual BackendKind kind() const = 0;

  // Binds listeners, starts I/O threads. kIoError with the reason when it cannot (e.g. the RDMA
  // backend with no libibverbs or no device: "rdma unavailable: ..."); the engine then leaves this
  // backend out and says so.
  virtual Status start(const BackendContext& context) = 0;
  virtual void stop() = 0;

  // The endpoint address to publish in the descriptor (valid after start()).
  virtual std::string local_address() const = 0;

  // Local regions coming and going, called by the engine under its registration lock before the
  // region is published (RDMA registers an MR here). An error refuses the registration.
  virtual Status on_region_registered(RegionId /*id*/, const Region& /*region*/) { return {}; }
  virtual void on_region_unregistered(RegionId /*id*/) {}
  // Opaque per-region bytes the peer needs (RDMA rkeys + address); empty when none. Stable for as
  // long as the region stays registered.
  virtual std::string region_keys(RegionId /*id*/) const { return {}; }

  // Whether this backend can serve a peer with this descriptor: it publishes an endpoint of this
  // kind and, for shm, lives on this host (hostname and boot id match `local`).
  virtual bool can_reach(const proto::TransferDescriptor& local,
                         const proto::TransferDescriptor& peer) const = 0;

  // Creates the state for a peer. May connect eagerly when that is cheap (shm) and fail here, so the
  // engine can fall back to the next backend; network backends connect lazily on first submit.
  virtual Status add_peer(PeerId peer, const proto::TransferDescriptor& descriptor) = 0;
  // Drops the peer: its in-flight tasks finish kFailed/kPeerGone before this returns or shortly
  // after (from the I/O thread).
  virtual void remove_peer(PeerId peer) = 0;

  virtual Status submit(XferTask* task) = 0;
  virtual void cancel(std::uint64_t xfer_id) = 0;
};

}  // namespace pdr::transfer
