// Pure builders for the ibv_modify_qp() attributes of an RC QP's RESET->INIT->RTR->RTS walk
// (docs/design/kv-transfer.md R-4). No verbs calls: unit-tested without a device.
//
// Values (rdma-core rc_pingpong.c, Mooncake rdma_endpoint.cpp): min_rnr_timer 12, timeout 14
// (4.096 us * 2^14 ~ 67 ms per retry), retry_cnt 7, rnr_retry 7 (= retry forever on RNR),
// path_mtu = min(local active, remote), max_dest_rd_atomic = max_rd_atomic = min(local device
// limit, peer's), GRH hop_limit 16. The GRH is set for RoCE (always) and for IB only when the
// peer published a non-zero GID and no LID.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "proto/rdma_handshake.h"

namespace pdr::transfer::rdma {

inline constexpr std::uint8_t kMinRnrTimer = 12;
inline constexpr std::uint8_t kTimeout = 14;
inline constexpr std::uint8_t kRetryCnt = 7;
inline constexpr std::uint8_t kRnrRetry = 7;
inline constexpr std::uint8_t kHopLimit = 16;

struct LocalPath {
  std::uint8_t port_num = 1;
  std::uint8_t sgid_index = 0;
  ibv_mtu active_mtu = IBV_MTU_4096;
  std::uint8_t max_rd_atomic = 16;  // device max_qp_rd_atom (clamped to >= 1)
  bool roce = true;                 // link layer Ethernet
};

struct QpTransition {
  ibv_qp_attr attr{};
  int mask = 0;
};

QpTransition build_init_transition(const LocalPath& local);
// qp_index selects remote.qpn/psn; the caller guarantees qp_index < remote.qpn.size().
QpTransition build_rtr_transition(const LocalPath& local, const proto::RdmaHandshake& remote,
                                  std::size_t qp_index);
// local_psn: the PSN this QP published for itself (its first send PSN).
QpTransition build_rts_transition(const LocalPath& local, const proto::RdmaHandshake& remote,
                                  std::uint32_t local_psn);

// min(local, remote), clamped to [1, 255].
std::uint8_t negotiated_rd_atomic(const LocalPath& local, const proto::RdmaHandshake& remote);

}  // namespace pdr::transfer::rdma
