#include "transfer/shm/serving_connection.h"

#include <chrono>

namespace pdr::transfer::shm {
namespace {
// A peer that does not drain its socket for this long is treated as gone.
constexpr std::chrono::milliseconds kSendTimeout{2000};
}  // namespace

void ExportedRegions::add(RegionId id) {
  std::lock_guard lock(mu_);
  ids_.insert(id);
}

void ExportedRegions::remove(RegionId id) {
  std::lock_guard lock(mu_);
  ids_.erase(id);
}

bool ExportedRegions::contains(RegionId id) const {
  std::lock_guard lock(mu_);
  return ids_.count(id) != 0;
}

std::vector<RegionId> ExportedRegions::list() const {
  std::lock_guard lock(mu_);
  return {ids_.begin(), ids_.end()};
}

ServingConnection::ServingConnection(UniqueFd fd, const ServingContext& context, pid_t peer_pid)
    : fd_(std::move(fd)), context_(context), peer_pid_(peer_pid) {}

ServingConnection::~ServingConnection() {
  // Closing the socket (fd_ is destroyed after this body, so close it first): the peer drops the
  // peer and its regions. Its copy in progress may still finish; with Yama, releasing the grant
  // makes any later attach fail.
  fd_.reset();
  if (holds_cma_) context_.cma->release(peer_pid_);
  if (context_.revoke_done) {
    for (RegionId id : revoking_) context_.revoke_done(id);
  }
}

bool ServingConnection::start_revoke(RegionId id, bool* send_failed) {
  *send_failed = false;
  if (cma_announced_.erase(id) == 0) return false;
  if (!send_frame(fd_.get(), encode_region_revoke(id), -1, kSendTimeout)) {
    *send_failed = true;
    return false;
  }
  revoking_.insert(id);
  return true;
}

bool ServingConnection::claim_cma() {
  if (!holds_cma_ && context_.cma != nullptr) holds_cma_ = context_.cma->acquire(peer_pid_);
  return holds_cma_;
}

bool ServingConnection::bad_frame() {
  context_.backend->counters->bad_frames.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool ServingConnection::on_readable() {
  for (;;) {
    const ReceiveBuffer::ReadResult read = rx_.read_once(fd_.get());
    // The initiator never passes fds to us: one arriving is a protocol violation.
    if (rx_.pending_fds() != 0) return bad_frame();
    if (read == ReceiveBuffer::ReadResult::kError) return false;
    for (;;) {
      Frame frame;
      std::size_t consumed = 0;
      if (Status s = decode_frame(rx_.data(), &frame, &consumed); !s) return bad_frame();
      if (consumed == 0) break;
      if (!handle(frame)) return false;
      rx_.consume(consumed);
    }
    if (read == ReceiveBuffer::ReadResult::kClosed) return false;
    if (read == ReceiveBuffer::ReadResult::kWouldBlock) return true;
  }
}

bool ServingConnection::handle(const Frame& frame) {
  const BackendContext& backend = *context_.backend;
  if (!hello_done_ && frame.type != MsgType::kHello) return bad_frame();
  switch (frame.type) {
    case MsgType::kHello:
      if (hello_done_) return bad_frame();
      hello_done_ = true;
      agent_.assign(frame.text);
      for (RegionId id : context_.exported->list()) {
        if (!send_region(id, /*count_refusal=*/false)) return false;
      }
      return send_frame(fd_.get(), encode_regions_end(0), -1, kSendTimeout).is_ok();
    case MsgType::kRegionQuery:
      if (frame.region_id == 0) return bad_frame();
      if (!send_region(frame.region_id, /*count_refusal=*/true)) return false;
      return send_frame(fd_.get(), encode_regions_end(frame.region_id), -1, kSendTimeout).is_ok();
    case MsgType::kNotify:
      backend.counters->notifications_received.fetch_add(1, std::memory_order_relaxed);
      if (backend.on_notification) backend.on_notification(agent_, frame.text);
      return send_frame(fd_.get(), encode_notify_ack(frame.seq), -1, kSendTimeout).is_ok();
    case MsgType::kRevokeAck:
      if (revoking_.erase(frame.region_id) == 0) return bad_frame();  // unsolicited
      if (context_.revoke_done) context_.revoke_done(frame.region_id);
      return true;
    case MsgType::kRegion:
    case MsgType::kRegionsEnd:
    case MsgType::kNotifyAck:
    case MsgType::kRegionRevoke:
      return bad_frame();  // server -> client messages
  }
  return bad_frame();
}

bool ServingConnection::send_region(RegionId id, bool count_refusal) {
  const BackendContext& backend = *context_.backend;
  std::optional<Region> region;
  if (context_.exported->contains(id)) region = backend.regions->lookup(id);
  if (!region || region->kind == MemKind::kDevice) {
    if (count_refusal) backend.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
    return true;  // answered by its absence: the initiator fails the task kAccess
  }
  // A memfd region maps from offset 0 of its fd (Engine::allocate_region owns the whole memfd).
  const int fd = backend.region_fd ? backend.region_fd(id) : -1;
  RegionInfo info{.id = id, .flags = 0, .length = region->length, .addr = 0};
  if (fd >= 0) {
    info.flags = kRegionHasFd;
  } else if (context_.allow_cma && claim_cma()) {
    info.flags = kRegionCma;
    info.addr = region->addr;
  } else {
    if (count_refusal) backend.counters->access_refused.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  if (info.flags == kRegionCma) cma_announced_.insert(id);
  return send_frame(fd_.get(), encode_region(info), fd, kSendTimeout).is_ok();
}

}  // namespace pdr::transfer::shm
