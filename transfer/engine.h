// Engine: the KV-block transfer engine's public API (docs/design/kv-transfer.md, Engine API).
//
//   auto engine = Engine::create({.agent = "prefill-0"}, make_backends(...));
//   engine->allocate_region(64 << 20, &region, &base);        // or register_region(addr, len, ...)
//   engine->define_layout({.region = region, .block_bytes = 16384, .stride = 16384,
//                          .block_count = 4096}, &layout);
//   std::string blob = engine->export_local();                // give it to the peer, any channel
//   engine->import_peer(peer_blob, &peer);                    // connects lazily
//   Completion done;
//   engine->submit(BlockXfer{XferOp::kRead, peer, layout, mine, peer_layout, theirs, "req-7"},
//                  &done);
//   done.wait_for(5s);   // or poll(), event_fd(), set_callback()
//
// Identity and descriptors: the local descriptor (proto/transfer_descriptor.h) carries the agent
// name, host identity (hostname + kernel boot id, for same-host detection), one endpoint per
// started backend, every registered region (id, length, kind), every layout, RDMA keys and the
// engine's random secret (32 bytes from libsodium, made by create()): a tcp peer must prove it
// holds it before it is served, so the descriptor is a capability to this engine's memory. A peer
// is addressed by the PeerId import_peer() returned; re-importing the same agent with an unchanged
// descriptor returns the same id, with a changed one (the peer restarted) drops the old peer
// state (its in-flight transfers fail kPeerGone) and returns a new id.
//
// Backend choice per peer: the first backend, in the order given to create(), that can_reach()
// the peer and accepts add_peer(); e.g. {shm, rdma, tcp} uses shared memory on the same host, RDMA
// where both have it, TCP otherwise.
//
// Safety: every transfer is validated before a byte moves: local ids against the region table and
// layouts, remote ids against the peer's descriptor (the peer checks again on its side). Errors are
// returned by submit() with a message naming the offending item; nothing is half-submitted.
//
// Threads: every method is thread-safe. Completions and notification callbacks run on backend I/O
// threads or the engine's deadline thread; they must not block.
//
// Deadlines and cancel: a transfer past its deadline finishes kFailed/kTimeout, cancel() finishes
// it kCancelled; in both cases the backend stops touching the local memory before the Completion
// turns final. A transfer whose bytes already all landed may still report kDone.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "proto/transfer_descriptor.h"
#include "transfer/backend.h"
#include "transfer/core/block_layout.h"
#include "transfer/core/completion.h"
#include "transfer/core/region_table.h"
#include "transfer/notification_queue.h"

namespace pdr::transfer {

using LayoutId = std::uint32_t;
using XferId = std::uint64_t;
using Clock = std::chrono::steady_clock;

struct EngineOptions {
  std::string agent;              // required: unique among the engines that talk to each other
  std::string hostname;           // default: gethostname()
  std::string boot_id;            // default: /proc/sys/kernel/random/boot_id
  // Coalesced runs longer than this are cut into pieces a backend may stripe across lanes (T-6).
  std::uint64_t max_segment_bytes = 4u << 20;
  std::size_t max_notification_bytes = 4096;  // longer notify messages are refused by submit()
  std::size_t max_queued_notifications = 65536;  // incoming; beyond it the oldest are dropped
  proto::DescriptorLimits descriptor_limits;  // for import_peer()
};

// A block-id transfer: local_blocks[i] <-> remote_blocks[i] for every layer in
// [first_layer, first_layer + layer_count) (layer_count 0: all from first_layer on).
struct BlockXfer {
  XferOp op = XferOp::kRead;
  PeerId peer = kInvalidPeer;
  LayoutId local_layout = 0;
  std::span<const std::uint32_t> local_blocks;
  LayoutId remote_layout = 0;  // the peer's layout id, from its descriptor
  std::span<const std::uint32_t> remote_blocks;
  std::string_view notify;  // optional: delivered to the peer after all the data is visible there
  Clock::time_point deadline = Clock::time_point::max();
  std::uint32_t first_layer = 0;
  std::uint32_t layer_count = 0;
};

struct RawSegment {
  RegionId local_region = kInvalidRegion;
  std::uint64_t local_offset = 0;
  RegionId remote_region = kInvalidRegion;  // the peer's region id
  std::uint64_t remote_offset = 0;
  std::uint64_t length = 0;
};

struct RawXfer {
  XferOp op = XferOp::kRead;
  PeerId peer = kInvalidPeer;
  std::span<const RawSegment> segments;
  std::string_view notify;
  Clock::time_point deadline = Clock::time_point::max();
};

class Engine {
 public:
  // Starts every backend; one that fails to start (e.g. rdma without a device) is left out and its
  // reason kept in skipped_backends(). Fails when options are invalid or no backend started.
  static Status create(EngineOptions options, std::vector<std::unique_ptr<Backend>> backends,
                       std::unique_ptr<Engine>* out);
  // Stops the backends; in-flight transfers finish (kFailed/kPeerGone or kCancelled) first.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::string& agent() const;

  // ---- memory ----
  Status register_region(void* addr, std::uint64_t length, MemKind kind, RegionId* id);
  // Allocates `length` bytes of zeroed, page-aligned host memory backed by a memfd (so the shm
  // backend can map it in a peer), registered as kHostShared. The engine owns it; it is unmapped by
  // unregister_region() or the destructor.
  Status allocate_region(std::uint64_t length, RegionId* id, std::byte** addr);
  // kRejected while transfers this engine submitted that use the region are in flight. Otherwise
  // the region is made dead at once (peers' new requests on it are refused kAccess) and the call
  // waits until no serving operation still touches it: a peer's WRITE frame half received has the
  // rest of its payload drained, a READ answer not yet sent becomes ERROR(kAccess) (one half sent
  // closes that connection), shm peers that reach it by cross-memory attach are told to drop it
  // and acknowledge (shm_backend.h). The wait is short (pins are held per non-blocking step, region_table.h); after ok the caller
  // may free the memory. Peers that mapped an allocate_region() memfd keep their own mapping (the
  // memfd pages stay alive while mapped and are never reused for other data of ours).
  Status unregister_region(RegionId id);
  Status define_layout(const BlockLayout& layout, LayoutId* id);

  // ---- peers ----
  std::string export_local() const;
  Status import_peer(std::span<const std::byte> descriptor, PeerId* peer);
  Status import_peer(std::string_view descriptor, PeerId* peer);
  // kNotFound for an unknown id. In-flight transfers to it finish kPeerGone.
  Status remove_peer(PeerId peer);
  // The backend serving a peer ("tcp", "shm", "rdma"), or "" for an unknown id.
  std::string_view peer_backend(PeerId peer) const;

  // ---- transfers ----
  // On ok, `completion` turns final exactly once (it must outlive the transfer and be pending) and
  // *id (optional) names the transfer for cancel(). On error nothing was sent and `completion` is
  // untouched.
  Status submit(const BlockXfer& xfer, Completion* completion, XferId* id = nullptr);
  Status submit(const RawXfer& xfer, Completion* completion, XferId* id = nullptr);
  // A bare notification, delivered after every transfer to `peer` that completed before the call.
  Status notify(PeerId peer, std::string_view message, Completion* completion);
  // kNotFound when the transfer already finished (or never existed).
  Status cancel(XferId id);

  // ---- incoming notifications ----
  // Moves every queued notification into *out (appending); returns how many.
  std::size_t take_notifications(std::vector<Notification>* out);
  // Waits for (and consumes) the first notification whose message equals `message`; false on
  // deadline. Notifications with other messages stay queued.
  bool wait_notification(std::string_view message, Clock::time_point deadline,
                         std::string* from = nullptr);
  // An eventfd readable while notifications are queued (level-triggered by take/wait).
  int notification_fd();

  // ---- observability ----
  const EngineCounters& counters() const;
  std::size_t in_flight() const;
  std::vector<std::string> skipped_backends() const;  // "rdma: no RDMA device found"
  std::vector<std::string> started_backends() const;  // "tcp 127.0.0.1:40123", ...

  class Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::transfer
