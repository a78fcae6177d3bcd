// The serving side of the shm control channel: one accepted connection from a peer's initiator.
// It answers HELLO and region queries with the regions this engine exports (memfd passed by
// SCM_RIGHTS, or the address for cross-memory attach) and delivers NOTIFY frames to the engine,
// acknowledging each after on_notification() returned (so the initiator's task finishes only once
// the message is delivered, which is after its data landed: the initiator copies before it
// notifies).
//
// Cross-memory attach: an fd-less region is announced by address only while this connection's
// peer process (SO_PEERCRED pid, checked against the allowed uids before this object exists) holds
// the backend's CmaGrant (cma_grant.h); otherwise it is answered by its absence, counted
// access_refused. The grant is released when this connection closes. Such a region, once
// unregistered, is revoked (start_revoke() sends kRegionRevoke); the peer's kRevokeAck, or this
// connection closing, reports it done through ServingContext::revoke_done.
//
// Threads: lives on, and is only called from, the backend's I/O thread. ExportedRegions is
// thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transfer/backend.h"
#include "transfer/shm/cma_grant.h"
#include "transfer/shm/shm_wire.h"
#include "transfer/shm/unix_channel.h"

namespace pdr::transfer::shm {

// The local regions peers may reach: the ids the engine announced through on_region_registered()
// and has not withdrawn.
class ExportedRegions {
 public:
  void add(RegionId id);
  void remove(RegionId id);
  bool contains(RegionId id) const;
  std::vector<RegionId> list() const;

 private:
  mutable std::mutex mu_;
  std::set<RegionId> ids_;
};

struct ServingContext {
  const BackendContext* backend = nullptr;
  const ExportedRegions* exported = nullptr;
  bool allow_cma = true;  // offer fd-less regions by address
  CmaGrant* cma = nullptr;  // the backend's; I/O thread only
  // Called (I/O thread) once per successful start_revoke(): on the peer's ack or when we close.
  std::function<void(RegionId)> revoke_done;
};

class ServingConnection {
 public:
  ServingConnection(UniqueFd fd, const ServingContext& context, pid_t peer_pid);
  ~ServingConnection();
  ServingConnection(const ServingConnection&) = delete;
  ServingConnection& operator=(const ServingConnection&) = delete;

  int fd() const { return fd_.get(); }
  bool said_hello() const { return hello_done_; }

  // Reads what is available and answers every complete frame. false: close this connection (the
  // peer hung up, or sent a bad frame: counted in bad_frames).
  bool on_readable();

  // If `id` was announced by address on this connection: sends kRegionRevoke and returns true
  // (revoke_done(id) follows). false: nothing to revoke here, or the send failed (then the caller
  // must close this connection, which reports revoke_done for what it started).
  bool start_revoke(RegionId id, bool* send_failed);
  bool revoking(RegionId id) const { return revoking_.count(id) != 0; }

 private:
  // false: protocol violation (counted) or a failed send.
  bool handle(const Frame& frame);
  bool send_region(RegionId id, bool count_refusal);
  bool bad_frame();
  bool claim_cma();  // true while this connection's peer may attach to us

  UniqueFd fd_;
  ServingContext context_;
  ReceiveBuffer rx_;
  std::string agent_;
  bool hello_done_ = false;
  pid_t peer_pid_;
  bool holds_cma_ = false;
  std::set<RegionId> cma_announced_;  // regions this peer may address by CMA
  std::set<RegionId> revoking_;       // kRegionRevoke sent, no ack yet
};

}  // namespace pdr::transfer::shm
