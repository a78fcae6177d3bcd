// Connection: one RC connection of the RDMA backend, the state that lives from the handshake that
// sets it up to the teardown that ends it: its QPs (QP 0 also carries the notify and reply SENDs),
// their send rings, and one slab of notify_slots receive slots followed by notify_slots send slots,
// registered as one MR with LOCAL_WRITE only (SEND/RECV buffers are never a peer's RDMA target).
//
// Connections are one-directional: the initiator side (server == false) carries our tasks to
// `peer`; the serving side (server == true) was accepted from a peer, only receives its notifies
// and sends replies.
//
// Lifecycle: create_connection() makes the QPs (RESET -> INIT) and posts a receive in every slot;
// local_record() is what the handshake sends; bring_up() walks the QPs to RTR and RTS with the
// peer's record; destroy_verbs() moves them to ERR, destroys them and deregisters the slab. The
// backend numbers connections by generation (State::create_conn), and the generation is part of
// every wr_id, so CQEs a destroyed connection leaves in the shared CQ are recognised and dropped.
//
// Threads: a Connection is owned by State::conns (backend_state.h) and touched only with the
// backend lock held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "proto/base/status.h"
#include "proto/rdma_handshake.h"
#include "transfer/backend.h"
#include "transfer/rdma/device.h"

namespace pdr::transfer::rdma {

// wr_id: kind (2 bits) | connection generation (22 bits) | sequence or receive slot (40 bits).
enum class WrKind : std::uint8_t { kData = 0, kNotify = 1, kReply = 2, kRecv = 3 };
inline constexpr std::uint32_t kGenMask = (1u << 22) - 1;
inline constexpr std::uint64_t kLowMask = (std::uint64_t{1} << 40) - 1;

struct WrId {
  WrKind kind = WrKind::kData;
  std::uint32_t gen = 0;
  std::uint64_t low = 0;  // send sequence number, or receive slot for kRecv
};

inline std::uint64_t make_wr_id(WrKind kind, std::uint32_t gen, std::uint64_t low) {
  return (std::uint64_t{static_cast<std::uint8_t>(kind)} << 62) |
         (std::uint64_t{gen & kGenMask} << 40) | (low & kLowMask);
}
inline WrId parse_wr_id(std::uint64_t wr_id) {
  return {static_cast<WrKind>(wr_id >> 62), static_cast<std::uint32_t>(wr_id >> 40) & kGenMask,
          wr_id & kLowMask};
}

// Sizes every connection of one backend shares, fixed when the backend is constructed.
struct ConnectionLimits {
  std::uint32_t max_send_wr = 2;   // per QP: WRs outstanding at most, and the send ring's size
  std::uint32_t notify_slots = 1;  // receives kept posted on QP 0, and as many send slots
  std::size_t slot_bytes = 0;      // one notify message at most (header + max_notify_bytes)
  std::uint32_t max_chain = 1;     // WRs chained into one post_send per QP and round
};

// What a posted send WR was, found again by its sequence number when its CQE retires it.
struct SendEntry {
  std::uint64_t task_id = 0;
  WrKind kind = WrKind::kData;
  bool read = false;
  std::uint32_t bytes = 0;
  std::uint32_t slot = 0;  // send slot of a notify/reply
};

struct QpState {
  ibv_qp* qp = nullptr;
  std::uint32_t psn = 0;
  std::vector<SendEntry> ring;  // indexed by seq % ring.size(); ring.size() == max_send_wr
  std::uint64_t next_seq = 1;   // seq of the next WR to post
  std::uint64_t retired = 0;    // every seq <= retired has completed
  std::uint32_t reads_out = 0;
  // The chain being built this round (preallocated: no allocation on the data path).
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
  std::uint32_t chain = 0;
  std::uint32_t chain_reads = 0;
  std::uint64_t outstanding() const { return next_seq - 1 - retired; }
};

struct Connection {
  std::uint32_t gen = 0;
  bool server = false;
  PeerId peer = kInvalidPeer;  // initiator side
  std::string remote_agent;
  int fd = -1;              // the control socket (control_socket.h), the QPs' liveness signal
  bool fd_watched = false;  // handed to the control thread, which then owns closing it
  bool ready = false;       // QPs in RTS: the I/O thread may post
  std::vector<QpState> qps;
  std::unique_ptr<std::byte[]> slab;  // notify_slots receive slots, then notify_slots send slots
  ibv_mr* slab_mr = nullptr;
  std::size_t slot_bytes = 0;
  std::uint32_t notify_slots = 0;
  std::vector<std::uint32_t> free_send_slots;
  std::uint32_t notifies_in_flight = 0;
  std::uint32_t rd_atomic = 1;  // negotiated READ depth per QP
  std::uint32_t rr = 0;         // the QP the next slice tries first
  std::deque<std::uint64_t> posting;       // initiator: tasks with WRs left to post
  std::deque<std::uint64_t> notify_queue;  // initiator: data done, notify not yet sent
  std::deque<std::pair<std::uint64_t, std::uint8_t>> reply_queue;  // target: replies to send

  std::byte* recv_slot(std::uint32_t slot) { return slab.get() + std::size_t{slot} * slot_bytes; }
  std::byte* send_slot(std::uint32_t slot) {
    return slab.get() + (std::size_t{notify_slots} + slot) * slot_bytes;
  }
  // Posts receive slot `slot` on QP 0; false when the QP refuses it.
  bool post_recv(const VerbsApi& api, std::uint32_t slot);
  // QPs to ERR, destroyed; the slab deregistered. Idempotent.
  void destroy_verbs(const VerbsApi& api);
};

// A connection of generation `gen` with `qp_count` QPs in INIT, every receive slot posted and
// every send slot free. Each QP's first PSN is drawn from `rng`. On failure nothing is left
// allocated on the device.
Status create_connection(const Device& device, const ConnectionLimits& limits, std::uint32_t gen,
                         bool server, std::size_t qp_count, std::mt19937& rng,
                         std::unique_ptr<Connection>* out);

// Our handshake record for `connection`: the device's path and GID, each QP's number and PSN, and
// `agent` (cut to proto::kRdmaMaxAgentBytes; "unnamed" when empty).
proto::RdmaHandshake local_record(const Device& device, const Connection& connection,
                                  const std::string& agent);

// RTR then RTS for every QP against the peer's record; negotiates the READ depth and remembers
// the peer's agent name. kInvalidValue when the peer offered another number of QPs.
Status bring_up(const Device& device, Connection& connection, const proto::RdmaHandshake& remote);

}  // namespace pdr::transfer::rdma
