// Engine: registration, descriptors, peers and the life of a transfer (validate -> coalesce ->
// resolve -> hand to the peer's backend -> finish). The backends do the I/O; see backend.h.
//
// Locks (never nested, except registry_mu_ -> a backend's on_region_registered, which must not
// call back into the engine; on_region_unregistered is called with no lock held, since the shm
// backend waits there for its I/O thread, which may itself ask region_fd()):
//   registry_mu_  regions' bookkeeping (owned memfds, in-flight counts) and layouts
//   peers_mu_     the peer table
//   tasks_mu_     in-flight transfers by id (cancel, deadlines, finish)
// A transfer holds no lock while its backend runs; finish() takes tasks_mu_ and registry_mu_ one
// after the other, then completes the caller's Completion with no lock held.
#include "transfer/engine.h"

#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "transfer/core/coalesce.h"
#include "transfer/deadline_timer.h"
#include "transfer/host_identity.h"
#include "transfer/memfd_region.h"

namespace pdr::transfer {

namespace {

proto::RegionKind descriptor_kind(MemKind kind) {
  return kind == MemKind::kDevice ? proto::RegionKind::kVram : proto::RegionKind::kDram;
}

BlockLayout to_block_layout(const proto::DescriptorLayout& layout) {
  return BlockLayout{layout.region_id,   layout.base_offset, layout.block_bytes, layout.stride,
                     layout.block_count, layout.layers,      layout.layer_stride};
}

Status invalid(std::string message) { return Status(StatusCode::kInvalidValue, std::move(message)); }

}  // namespace

class Engine::Impl {
 public:
  explicit Impl(EngineOptions options)
      : options_(std::move(options)),
        notifications_(options_.max_queued_notifications),
        deadlines_([this](std::uint64_t id) { (void)cancel_with(id, XferCause::kTimeout); }) {}

  Status start(std::vector<std::unique_ptr<Backend>> backends);
  void stop();

  Status register_region(void* addr, std::uint64_t length, MemKind kind, RegionId* id,
                         MemfdRegion owned);
  Status unregister_region(RegionId id);
  Status define_layout(const BlockLayout& layout, LayoutId* id);

  proto::TransferDescriptor local_descriptor() const;
  Status import_peer(std::span<const std::byte> bytes, PeerId* peer);
  Status remove_peer(PeerId peer);
  std::string_view peer_backend(PeerId peer) const;

  Status submit_block(const BlockXfer& xfer, Completion* completion, XferId* id);
  Status submit_raw(const RawXfer& xfer, Completion* completion, XferId* id);
  Status cancel_with(XferId id, XferCause cause);
  std::size_t in_flight() {
    std::lock_guard lock(tasks_mu_);
    return tasks_.size();
  }

  EngineOptions options_;
  std::string secret_;  // random, per engine; in the descriptor and the backends' context
  RegionTable regions_;
  EngineCounters counters_;
  NotificationQueue notifications_;
  std::vector<std::unique_ptr<Backend>> backends_;  // started ones, in preference order
  std::vector<std::string> skipped_;

 private:
  struct RegionInfo {
    MemKind kind = MemKind::kHostDram;
    std::uint64_t length = 0;
    MemfdRegion owned;         // empty for caller memory
    std::uint32_t in_flight = 0;
    bool dying = false;  // unregister_region() is fencing it off: not usable, not listed
  };
  struct Peer {
    std::string agent;
    std::string blob;  // the descriptor as imported, to recognise a re-import
    proto::TransferDescriptor descriptor;
    Backend* backend = nullptr;
  };
  struct Pending {
    std::unique_ptr<XferTask> task;
    Completion* completion = nullptr;
    Backend* backend = nullptr;
    std::vector<RegionId> regions;  // local regions it pins (deduplicated)
    bool has_deadline = false;
  };

  static void on_finish(void* owner, XferTask* task, const XferResult& result);
  void finish(XferTask* task, const XferResult& result);

  // Checks the notify size, looks up the peer and its backend; copies what submit needs so no lock
  // is held afterwards.
  Status check_submit(std::string_view notify, PeerId peer, proto::TransferDescriptor* descriptor,
                      Backend** backend);
  // Resolves local addresses, checks the remote side against the descriptor, pins the regions and
  // hands the task to the backend.
  Status launch(std::unique_ptr<XferTask> task, const proto::TransferDescriptor& peer,
                Backend* backend, Completion* completion, Clock::time_point deadline,
                XferId* id);
  int region_fd(RegionId id);

  mutable std::mutex registry_mu_;
  std::unordered_map<RegionId, RegionInfo> region_info_;
  std::vector<BlockLayout> layouts_;  // LayoutId = index + 1

  mutable std::mutex peers_mu_;
  std::map<PeerId, Peer> peers_;
  std::unordered_map<std::string, PeerId> peer_by_agent_;
  PeerId next_peer_ = 1;

  std::mutex tasks_mu_;
  std::unordered_map<XferId, Pending> tasks_;
  std::atomic<XferId> next_xfer_{1};

  DeadlineTimer deadlines_;  // last: its thread calls cancel_with() until it is destroyed
};

// ---- life cycle ----

Status Engine::Impl::start(std::vector<std::unique_ptr<Backend>> backends) {
  BackendContext context;
  context.agent = options_.agent;
  context.secret = secret_;
  context.regions = &regions_;
  context.counters = &counters_;
  // Backends count notifications_sent/received themselves (backend.h).
  context.on_notification = [this](std::string_view from, std::string_view message) {
    notifications_.push(from, message);
  };
  context.region_fd = [this](RegionId id) { return region_fd(id); };
  for (std::unique_ptr<Backend>& backend : backends) {
    if (backend == nullptr) continue;
    Status s = backend->start(context);
    if (!s) {
      skipped_.push_back(std::string(backend_kind_label(backend->kind())) + ": " + s.message());
      backend->stop();
      continue;
    }
    backends_.push_back(std::move(backend));
  }
  if (backends_.empty()) {
    std::string reasons;
    for (const std::string& reason : skipped_) reasons += (reasons.empty() ? "" : "; ") + reason;
    return Status(StatusCode::kIoError,
                  "no transfer backend started" + (reasons.empty() ? "" : ": " + reasons));
  }
  return Status::ok();
}

void Engine::Impl::stop() {
  // No more deadline cancels into stopping backends. Backends finish every in-flight transfer
  // before stop() returns (backend.h), so nothing touches the regions freed afterwards.
  deadlines_.shutdown();
  for (std::unique_ptr<Backend>& backend : backends_) backend->stop();
}

// ---- memory ----

int Engine::Impl::region_fd(RegionId id) {
  std::lock_guard lock(registry_mu_);
  auto it = region_info_.find(id);
  return it == region_info_.end() ? -1 : it->second.owned.fd();
}

Status Engine::Impl::register_region(void* addr, std::uint64_t length, MemKind kind, RegionId* id,
                                     MemfdRegion owned) {
  std::lock_guard lock(registry_mu_);
  RegionId region = kInvalidRegion;
  if (Status s = regions_.register_region(addr, length, kind, &region); !s) return s;
  // Record the memfd before the backends hear of the region: the shm backend may ask for it.
  region_info_[region] = RegionInfo{kind, length, std::move(owned), 0, false};
  const Region view{reinterpret_cast<std::uintptr_t>(addr), length, kind};
  for (std::size_t i = 0; i < backends_.size(); ++i) {
    Status s = backends_[i]->on_region_registered(region, view);
    if (!s) {
      for (std::size_t j = 0; j < i; ++j) backends_[j]->on_region_unregistered(region);
      region_info_.erase(region);
      (void)regions_.unregister_region(region);
      return Status(s.code(), std::string(backend_kind_label(backends_[i]->kind())) +
                                  " refused the region: " + s.message());
    }
  }
  *id = region;
  return Status::ok();
}

Status Engine::Impl::unregister_region(RegionId id) {
  MemfdRegion released;  // unmapped after the lock is dropped
  {
    std::lock_guard lock(registry_mu_);
    auto it = region_info_.find(id);
    if (it == region_info_.end() || it->second.dying) {
      return Status(StatusCode::kNotFound, "region " + std::to_string(id) + " is not registered");
    }
    if (it->second.in_flight > 0) {
      return Status(StatusCode::kRejected, "region " + std::to_string(id) + " has " +
                                               std::to_string(it->second.in_flight) +
                                               " transfers in flight");
    }
    for (const BlockLayout& layout : layouts_) {
      if (layout.region == id) {
        return Status(StatusCode::kRejected,
                      "region " + std::to_string(id) + " still has layouts defined over it");
      }
    }
    it->second.dying = true;  // no new local transfer, layout or descriptor uses it from here
  }
  // Revocation: the table makes the region dead for peers' requests and waits until no
  // serving operation still touches it (region_table.h Lifetime); then each backend drops what it
  // exported (shm: CMA peers drop the address, RDMA: the MR). No lock held: these wait.
  (void)regions_.unregister_region(id);
  for (std::unique_ptr<Backend>& backend : backends_) backend->on_region_unregistered(id);
  {
    std::lock_guard lock(registry_mu_);
    auto it = region_info_.find(id);
    released = std::move(it->second.owned);
    region_info_.erase(it);
  }
  return Status::ok();
}

Status Engine::Impl::define_layout(const BlockLayout& layout, LayoutId* id) {
  std::lock_guard lock(registry_mu_);
  if (auto it = region_info_.find(layout.region); it != region_info_.end() && it->second.dying) {
    return Status(StatusCode::kNotFound, "region " + std::to_string(layout.region) +
                                             " is being unregistered");
  }
  if (Status s = validate_layout(layout, regions_); !s) return s;
  if (layouts_.size() >= proto::DescriptorLimits{}.max_layouts) {
    return Status(StatusCode::kRejected, "at most " +
                                             std::to_string(proto::DescriptorLimits{}.max_layouts) +
                                             " layouts fit in a descriptor");
  }
  layouts_.push_back(layout);
  *id = static_cast<LayoutId>(layouts_.size());
  return Status::ok();
}

// ---- descriptors and peers ----

proto::TransferDescriptor Engine::Impl::local_descriptor() const {
  proto::TransferDescriptor d;
  d.agent = options_.agent;
  d.hostname = options_.hostname;
  d.boot_id = options_.boot_id;
  d.secret = secret_;
  for (const std::unique_ptr<Backend>& backend : backends_) {
    d.endpoints.push_back({endpoint_backend(backend->kind()), backend->local_address()});
  }
  std::lock_guard lock(registry_mu_);
  std::vector<RegionId> ids;
  for (const auto& [id, info] : region_info_) {
    if (!info.dying) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (RegionId id : ids) {
    const RegionInfo& info = region_info_.at(id);
    d.regions.push_back({id, info.length, descriptor_kind(info.kind)});
    for (const std::unique_ptr<Backend>& backend : backends_) {
      std::string keys = backend->region_keys(id);
      if (!keys.empty()) {
        d.rkeys.push_back({id, std::move(keys)});
        break;
      }
    }
  }
  for (std::size_t i = 0; i < layouts_.size(); ++i) {
    const BlockLayout& l = layouts_[i];
    d.layouts.push_back({static_cast<std::uint32_t>(i + 1), l.region, l.block_bytes, l.stride,
                         l.block_count, l.layers, l.layer_stride, l.base_offset});
  }
  return d;
}

Status Engine::Impl::import_peer(std::span<const std::byte> bytes, PeerId* peer) {
  proto::TransferDescriptor descriptor;
  if (Status s = proto::decode_descriptor(bytes, options_.descriptor_limits, &descriptor); !s) {
    return s;
  }
  std::string blob(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  PeerId replaced = kInvalidPeer;
  {
    std::lock_guard lock(peers_mu_);
    auto known = peer_by_agent_.find(descriptor.agent);
    if (known != peer_by_agent_.end()) {
      if (peers_.at(known->second).blob == blob) {
        *peer = known->second;
        return Status::ok();
      }
      replaced = known->second;
    }
  }
  if (replaced != kInvalidPeer) (void)remove_peer(replaced);  // the peer restarted

  const proto::TransferDescriptor local = local_descriptor();
  PeerId id = kInvalidPeer;
  {
    std::lock_guard lock(peers_mu_);
    id = next_peer_++;
  }
  std::string refusals;
  for (const std::unique_ptr<Backend>& backend : backends_) {
    if (!backend->can_reach(local, descriptor)) continue;
    Status s = backend->add_peer(id, descriptor);
    if (!s) {
      refusals += std::string(refusals.empty() ? "" : "; ") +
                  std::string(backend_kind_label(backend->kind())) + ": " + s.message();
      continue;
    }
    std::lock_guard lock(peers_mu_);
    peer_by_agent_[descriptor.agent] = id;
    std::string agent = descriptor.agent;
    peers_[id] = Peer{std::move(agent), std::move(blob), std::move(descriptor), backend.get()};
    *peer = id;
    return Status::ok();
  }
  std::string offered;
  for (const proto::DescriptorEndpoint& endpoint : descriptor.endpoints) {
    offered += std::string(offered.empty() ? "" : ", ") + std::string(to_string(endpoint.backend)) +
               " " + endpoint.address;
  }
  return Status(StatusCode::kRejected,
                "no backend reaches agent '" + descriptor.agent + "' (it offers " +
                    (offered.empty() ? "nothing" : offered) + ")" +
                    (refusals.empty() ? "" : ": " + refusals));
}

Status Engine::Impl::remove_peer(PeerId peer) {
  Backend* backend = nullptr;
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
      return Status(StatusCode::kNotFound, "peer " + std::to_string(peer) + " is not known");
    }
    backend = it->second.backend;
    auto by_agent = peer_by_agent_.find(it->second.agent);
    if (by_agent != peer_by_agent_.end() && by_agent->second == peer) peer_by_agent_.erase(by_agent);
    peers_.erase(it);
  }
  backend->remove_peer(peer);
  return Status::ok();
}

std::string_view Engine::Impl::peer_backend(PeerId peer) const {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(peer);
  return it == peers_.end() ? std::string_view() : backend_kind_label(it->second.backend->kind());
}

// ---- transfers ----

Status Engine::Impl::check_submit(std::string_view notify, PeerId peer,
                                  proto::TransferDescriptor* descriptor, Backend** backend) {
  if (notify.size() > options_.max_notification_bytes) {
    return invalid("notify message is " + std::to_string(notify.size()) + " bytes, limit " +
                   std::to_string(options_.max_notification_bytes));
  }
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) {
    return Status(StatusCode::kNotFound, "peer " + std::to_string(peer) + " is not known");
  }
  *descriptor = it->second.descriptor;
  *backend = it->second.backend;
  return Status::ok();
}

Status Engine::Impl::submit_block(const BlockXfer& xfer, Completion* completion, XferId* id) {
  proto::TransferDescriptor peer;
  Backend* backend = nullptr;
  if (Status s = check_submit(xfer.notify, xfer.peer, &peer, &backend); !s) return s;
  BlockLayout local;
  {
    std::lock_guard lock(registry_mu_);
    if (xfer.local_layout == 0 || xfer.local_layout > layouts_.size()) {
      return Status(StatusCode::kNotFound,
                    "local layout " + std::to_string(xfer.local_layout) + " is not defined");
    }
    local = layouts_[xfer.local_layout - 1];
  }
  auto remote_it = std::find_if(peer.layouts.begin(), peer.layouts.end(),
                                [&](const auto& l) { return l.id == xfer.remote_layout; });
  if (remote_it == peer.layouts.end()) {
    return Status(StatusCode::kNotFound, "peer '" + peer.agent + "' has no layout " +
                                             std::to_string(xfer.remote_layout));
  }
  const BlockLayout remote = to_block_layout(*remote_it);
  const CoalesceOptions coalesce_options{options_.max_segment_bytes, xfer.first_layer,
                                         xfer.layer_count};
  const std::size_t max_segments =
      coalesce_max_segments(xfer.local_blocks.size(), local, coalesce_options);
  if (max_segments == 0 && !xfer.local_blocks.empty()) {
    return Status(StatusCode::kTooLarge, "transfer is too large to plan");
  }
  std::vector<Segment> planned(max_segments);
  std::size_t count = 0;
  if (Status s = coalesce(local, xfer.local_blocks, remote, xfer.remote_blocks, planned, &count,
                          coalesce_options);
      !s) {
    return s;
  }
  auto task = std::make_unique<XferTask>(next_xfer_.fetch_add(1), xfer.op, xfer.peer, &on_finish,
                                         this);
  std::vector<XferSegment>& segments = task->mutable_segments();
  segments.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    segments.push_back({local.region, planned[i].local_offset, nullptr, remote.region,
                        planned[i].remote_offset, planned[i].length});
  }
  task->set_notify(xfer.notify);
  return launch(std::move(task), peer, backend, completion, xfer.deadline, id);
}

Status Engine::Impl::submit_raw(const RawXfer& xfer, Completion* completion, XferId* id) {
  proto::TransferDescriptor peer;
  Backend* backend = nullptr;
  if (Status s = check_submit(xfer.notify, xfer.peer, &peer, &backend); !s) return s;
  auto task = std::make_unique<XferTask>(next_xfer_.fetch_add(1), xfer.op, xfer.peer, &on_finish,
                                         this);
  std::vector<XferSegment>& segments = task->mutable_segments();
  const std::uint64_t piece = options_.max_segment_bytes;
  for (const RawSegment& raw : xfer.segments) {
    // Cut like coalesced runs, so backends see the same piece sizes either way.
    std::uint64_t done = 0;
    do {
      const std::uint64_t length =
          piece == 0 ? raw.length - done : std::min(piece, raw.length - done);
      segments.push_back({raw.local_region, raw.local_offset + done, nullptr, raw.remote_region,
                          raw.remote_offset + done, length});
      done += length;
    } while (done < raw.length);
  }
  task->set_notify(xfer.notify);
  return launch(std::move(task), peer, backend, completion, xfer.deadline, id);
}

Status Engine::Impl::launch(std::unique_ptr<XferTask> task, const proto::TransferDescriptor& peer,
                            Backend* backend, Completion* completion, Clock::time_point deadline,
                            XferId* id) {
  if (completion == nullptr) return invalid("a transfer needs a Completion");
  if (completion->poll().state != XferState::kPending) {
    return invalid("the Completion already holds a final result; rearm() it first");
  }
  std::uint64_t total = 0;
  std::vector<RegionId> pinned;
  std::vector<XferSegment>& segments = task->mutable_segments();
  for (std::size_t i = 0; i < segments.size(); ++i) {
    XferSegment& segment = segments[i];
    const std::string name = "segment " + std::to_string(i);
    if (Status s = regions_.resolve(segment.local_region, segment.local_offset, segment.length,
                                    &segment.local_addr);
        !s) {
      return Status(s.code(), name + " (local): " + s.message());
    }
    auto region = std::find_if(peer.regions.begin(), peer.regions.end(),
                               [&](const auto& r) { return r.id == segment.remote_region; });
    if (region == peer.regions.end()) {
      return Status(StatusCode::kNotFound, name + ": peer '" + peer.agent + "' has no region " +
                                               std::to_string(segment.remote_region));
    }
    if (segment.remote_offset > region->length ||
        segment.length > region->length - segment.remote_offset) {
      return Status(StatusCode::kOutOfRange,
                    name + ": remote offset " + std::to_string(segment.remote_offset) +
                        " + length " + std::to_string(segment.length) + " is outside region " +
                        std::to_string(region->id) + " (" + std::to_string(region->length) +
                        " bytes) of peer '" + peer.agent + "'");
    }
    total += segment.length;
    if (std::find(pinned.begin(), pinned.end(), segment.local_region) == pinned.end()) {
      pinned.push_back(segment.local_region);
    }
  }
  task->set_total_bytes(total);
  {
    // Pin the regions; a concurrent unregister_region() between resolve() and here is caught by
    // the lookup (the region would be gone from region_info_).
    std::lock_guard lock(registry_mu_);
    for (RegionId region : pinned) {
      if (auto it = region_info_.find(region); it == region_info_.end() || it->second.dying) {
        return Status(StatusCode::kNotFound,
                      "region " + std::to_string(region) + " was unregistered");
      }
    }
    for (RegionId region : pinned) ++region_info_[region].in_flight;
  }
  const XferId xfer_id = task->id();
  XferTask* raw = task.get();
  const bool has_deadline = deadline != Clock::time_point::max();
  {
    std::lock_guard lock(tasks_mu_);
    tasks_[xfer_id] = Pending{std::move(task), completion, backend, std::move(pinned), has_deadline};
  }
  if (id != nullptr) *id = xfer_id;
  counters_.xfers_submitted.fetch_add(1, std::memory_order_relaxed);
  if (has_deadline) deadlines_.add(xfer_id, deadline);
  Status s = backend->submit(raw);
  if (!s) {
    // Not submitted: undo without completing the caller's Completion.
    if (has_deadline) deadlines_.remove(xfer_id);
    Pending pending;
    {
      std::lock_guard lock(tasks_mu_);
      auto it = tasks_.find(xfer_id);
      pending = std::move(it->second);
      tasks_.erase(it);
    }
    std::lock_guard lock(registry_mu_);
    for (RegionId region : pending.regions) --region_info_[region].in_flight;
    counters_.xfers_submitted.fetch_sub(1, std::memory_order_relaxed);
    return s;
  }
  return Status::ok();
}

void Engine::Impl::on_finish(void* owner, XferTask* task, const XferResult& result) {
  static_cast<Impl*>(owner)->finish(task, result);
}

void Engine::Impl::finish(XferTask* task, const XferResult& result) {
  Pending pending;
  {
    std::lock_guard lock(tasks_mu_);
    auto it = tasks_.find(task->id());
    if (it == tasks_.end()) return;  // a backend bug (double finish); never complete twice
    pending = std::move(it->second);
    tasks_.erase(it);
  }
  if (pending.has_deadline) deadlines_.remove(task->id());
  {
    std::lock_guard lock(registry_mu_);
    for (RegionId region : pending.regions) --region_info_[region].in_flight;
  }
  XferResult final = result;
  if (final.state == XferState::kPending) final = {XferState::kFailed, XferCause::kInternal, 0};
  // A cancel request that lost the race to completion still reports the backend's outcome, except
  // that a cancelled transfer reports the cause the engine asked for (kCancelled vs kTimeout).
  if (final.state == XferState::kCancelled || final.cause == XferCause::kTimeout) {
    const XferCause asked = task->cancel_cause();
    if (asked == XferCause::kTimeout) final = {XferState::kFailed, XferCause::kTimeout,
                                               final.bytes_done};
    if (asked == XferCause::kCancelled) final = {XferState::kCancelled, XferCause::kCancelled,
                                                 final.bytes_done};
  }
  switch (final.state) {
    case XferState::kDone: counters_.xfers_done.fetch_add(1, std::memory_order_relaxed); break;
    case XferState::kCancelled:
      counters_.xfers_cancelled.fetch_add(1, std::memory_order_relaxed);
      break;
    default:
      if (final.cause == XferCause::kTimeout) {
        counters_.xfers_cancelled.fetch_add(1, std::memory_order_relaxed);
      } else {
        counters_.xfers_failed.fetch_add(1, std::memory_order_relaxed);
      }
  }
  Completion* completion = pending.completion;
  pending.task.reset();  // frees `task`
  completion->complete(final);
}

Status Engine::Impl::cancel_with(XferId id, XferCause cause) {
  Backend* backend = nullptr;
  {
    std::lock_guard lock(tasks_mu_);
    auto it = tasks_.find(id);
    if (it == tasks_.end()) {
      return Status(StatusCode::kNotFound, "transfer " + std::to_string(id) + " is not in flight");
    }
    if (!it->second.task->request_cancel(cause)) return Status::ok();  // already asked
    backend = it->second.backend;
  }
  // By id, with no lock: the task may finish (and be freed) meanwhile; the backend then ignores it.
  backend->cancel(id);
  return Status::ok();
}

// ---- Engine ----

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  if (impl_ != nullptr) impl_->stop();
}

Status Engine::create(EngineOptions options, std::vector<std::unique_ptr<Backend>> backends,
                      std::unique_ptr<Engine>* out) {
  if (options.agent.empty()) return invalid("an engine needs an agent name");
  if (options.agent.size() > proto::DescriptorLimits{}.max_string_bytes) {
    return invalid("agent name is longer than " +
                   std::to_string(proto::DescriptorLimits{}.max_string_bytes) + " bytes");
  }
  if (options.hostname.empty()) options.hostname = local_hostname();
  if (options.boot_id.empty()) options.boot_id = local_boot_id();
  if (sodium_init() < 0) return Status(StatusCode::kIoError, "libsodium failed to initialise");
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->secret_.resize(proto::kTransferSecretBytes);
  randombytes_buf(impl->secret_.data(), impl->secret_.size());
  if (Status s = impl->start(std::move(backends)); !s) {
    impl->stop();
    return s;
  }
  out->reset(new Engine(std::move(impl)));
  return Status::ok();
}

const std::string& Engine::agent() const { return impl_->options_.agent; }

Status Engine::register_region(void* addr, std::uint64_t length, MemKind kind, RegionId* id) {
  return impl_->register_region(addr, length, kind, id, MemfdRegion());
}

Status Engine::allocate_region(std::uint64_t length, RegionId* id, std::byte** addr) {
  MemfdRegion region;
  if (Status s = MemfdRegion::create(length, "pdr-kv-" + impl_->options_.agent, &region); !s) {
    return s;
  }
  std::byte* data = region.data();
  if (Status s = impl_->register_region(data, length, MemKind::kHostShared, id, std::move(region));
      !s) {
    return s;
  }
  *addr = data;
  return Status::ok();
}

Status Engine::unregister_region(RegionId id) { return impl_->unregister_region(id); }

Status Engine::define_layout(const BlockLayout& layout, LayoutId* id) {
  return impl_->define_layout(layout, id);
}

std::string Engine::export_local() const {
  return proto::encode_descriptor(impl_->local_descriptor());
}

Status Engine::import_peer(std::span<const std::byte> descriptor, PeerId* peer) {
  return impl_->import_peer(descriptor, peer);
}

Status Engine::import_peer(std::string_view descriptor, PeerId* peer) {
  return impl_->import_peer(std::as_bytes(std::span(descriptor.data(), descriptor.size())), peer);
}

Status Engine::remove_peer(PeerId peer) { return impl_->remove_peer(peer); }

std::string_view Engine::peer_backend(PeerId peer) const { return impl_->peer_backend(peer); }

Status Engine::submit(const BlockXfer& xfer, Completion* completion, XferId* id) {
  return impl_->submit_block(xfer, completion, id);
}

Status Engine::submit(const RawXfer& xfer, Completion* completion, XferId* id) {
  return impl_->submit_raw(xfer, completion, id);
}

Status Engine::notify(PeerId peer, std::string_view message, Completion* completion) {
  if (message.empty()) return invalid("a notification needs a message");
  return impl_->submit_raw(RawXfer{XferOp::kWrite, peer, {}, message}, completion, nullptr);
}

Status Engine::cancel(XferId id) { return impl_->cancel_with(id, XferCause::kCancelled); }

std::size_t Engine::take_notifications(std::vector<Notification>* out) {
  return impl_->notifications_.take_all(out);
}

bool Engine::wait_notification(std::string_view message, Clock::time_point deadline,
                               std::string* from) {
  return impl_->notifications_.wait_for(message, deadline, from);
}

int Engine::notification_fd() { return impl_->notifications_.event_fd(); }

const EngineCounters& Engine::counters() const { return impl_->counters_; }

std::size_t Engine::in_flight() const { return impl_->in_flight(); }

std::vector<std::string> Engine::skipped_backends() const { return impl_->skipped_; }

std::vector<std::string> Engine::started_backends() const {
  std::vector<std::string> out;
  for (const std::unique_ptr<Backend>& backend : impl_->backends_) {
    out.push_back(std::string(backend_kind_label(backend->kind())) + " " +
                  backend->local_address());
  }
  return out;
}

}  // namespace pdr::transfer
