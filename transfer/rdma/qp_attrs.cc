// QP transition attributes (contract: qp_attrs.h).
#include "transfer/rdma/qp_attrs.h"

#include <algorithm>

namespace pdr::transfer::rdma {

namespace {
bool gid_is_zero(const std::array<std::uint8_t, 16>& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}
}  // namespace

std::uint8_t negotiated_rd_atomic(const LocalPath& local, const proto::RdmaHandshake& remote) {
  const std::uint8_t value = std::min(local.max_rd_atomic, remote.max_rd_atomic);
  return value == 0 ? 1 : value;
}

QpTransition build_init_transition(const LocalPath& local) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_INIT;
  t.attr.pkey_index = 0;
  t.attr.port_num = local.port_num;
  // LOCAL_WRITE is needed for receives; the remote flags let the peer's READ/WRITE target our MRs
  // (the MR's own flags still decide per region).
  t.attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  t.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return t;
}

QpTransition build_rtr_transition(const LocalPath& local, const proto::RdmaHandshake& remote,
                                  std::size_t qp_index) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTR;
  t.attr.path_mtu = std::min(local.active_mtu, static_cast<ibv_mtu>(remote.path_mtu));
  t.attr.dest_qp_num = remote.qpn[qp_index];
  t.attr.rq_psn = remote.psn[qp_index];
  t.attr.max_dest_rd_atomic = negotiated_rd_atomic(local, remote);
  t.attr.min_rnr_timer = kMinRnrTimer;
  t.attr.ah_attr.dlid = remote.lid;
  t.attr.ah_attr.sl = 0;
  t.attr.ah_attr.src_path_bits = 0;
  t.attr.ah_attr.port_num = local.port_num;
  if (local.roce || (remote.lid == 0 && !gid_is_zero(remote.gid))) {
    t.attr.ah_attr.is_global = 1;
    std::copy(remote.gid.begin(), remote.gid.end(), t.attr.ah_attr.grh.dgid.raw);
    t.attr.ah_attr.grh.sgid_index = local.sgid_index;
    t.attr.ah_attr.grh.hop_limit = kHopLimit;
  }
  t.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
           IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return t;
}

QpTransition build_rts_transition(const LocalPath& local, const proto::RdmaHandshake& remote,
                                  std::uint32_t local_psn) {
  QpTransition t;
  t.attr.qp_state = IBV_QPS_RTS;
  t.attr.timeout = kTimeout;
  t.attr.retry_cnt = kRetryCnt;
  t.attr.rnr_retry = kRnrRetry;
  t.attr.sq_psn = local_psn;
  t.attr.max_rd_atomic = negotiated_rd_atomic(local, remote);
  t.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
           IBV_QP_MAX_QP_RD_ATOMIC;
  return t;
}

}  // namespace pdr::transfer::rdma
