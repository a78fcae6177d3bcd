// The serving side of the shm control channel: one accepted connection from a peer's initiator.
// It answers HELLO and region queries with the regions this engine exports (memfd passed by
// SCM_RIGHTS, or the address for cross-memory attach) and delivers NOTIFY frames to the engine,
// acknowledging each after on_notification() returned (so the initiator's task finishes only once
// the message is delivered, which is after its data landed: the initiator copies before it
// notifies).
//
// Threads: lives on, and is only called from, the backend's I/O thread. ExportedRegions is
// thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "transfer/backend.h"
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
};

class ServingConnection {
 public:
  ServingConnection(UniqueFd fd, const ServingContext& context);

  int fd() const { return fd_.get(); }
  bool said_hello() const { return hello_done_; }

  // Reads what is available and answers every complete frame. false: close this connection (the
  // peer hung up, or sent a bad frame: counted in bad_frames).
  bool on_readable();

 private:
  // false: protocol violation (counted) or a failed send.
  bool handle(const Frame& frame);
  bool send_region(RegionId id, bool count_refusal);
  bool bad_frame();

  UniqueFd fd_;
  ServingContext context_;
  ReceiveBuffer rx_;
  std::string agent_;
  bool hello_done_ = false;
};

}  // namespace pdr::transfer::shm
