// QP transition builders (transfer/rdma/qp_attrs.h): the R-4 values and masks, no device.
#include "transfer/rdma/qp_attrs.h"

#include <gtest/gtest.h>

namespace pdr::transfer::rdma {
namespace {

proto::RdmaHandshake remote_record() {
  proto::RdmaHandshake r;
  r.gid[10] = 0xff;
  r.gid[11] = 0xff;
  r.gid[12] = 127;  // ::ffff:127.0.10.2
  r.gid[14] = 10;
  r.gid[15] = 2;
  r.lid = 0;
  r.path_mtu = IBV_MTU_1024;
  r.max_rd_atomic = 8;
  r.qpn = {0x101, 0x102};
  r.psn = {0xabcdef, 0x123456};
  r.agent = "peer";
  return r;
}

TEST(RdmaQpAttrs, InitGrantsRemoteReadWrite) {
  LocalPath local;
  local.port_num = 2;
  const QpTransition t = build_init_transition(local);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(t.attr.port_num, 2);
  EXPECT_EQ(t.attr.qp_access_flags,
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

TEST(RdmaQpAttrs, RtrUsesPeerQpnPsnMinMtuAndMinRdAtomic) {
  LocalPath local;
  local.sgid_index = 3;
  local.active_mtu = IBV_MTU_4096;
  local.max_rd_atomic = 16;
  const proto::RdmaHandshake remote = remote_record();
  const QpTransition t = build_rtr_transition(local, remote, 1);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(t.attr.path_mtu, IBV_MTU_1024);
  EXPECT_EQ(t.attr.dest_qp_num, 0x102u);
  EXPECT_EQ(t.attr.rq_psn, 0x123456u);
  EXPECT_EQ(t.attr.max_dest_rd_atomic, 8);
  EXPECT_EQ(t.attr.min_rnr_timer, 12);
  EXPECT_EQ(t.attr.ah_attr.is_global, 1);
  EXPECT_EQ(t.attr.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(t.attr.ah_attr.grh.hop_limit, kHopLimit);
  EXPECT_EQ(t.attr.ah_attr.grh.dgid.raw[12], 127);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

TEST(RdmaQpAttrs, RtrOnInfinibandUsesLidWithoutGrh) {
  LocalPath local;
  local.roce = false;
  proto::RdmaHandshake remote = remote_record();
  remote.lid = 17;
  const QpTransition t = build_rtr_transition(local, remote, 0);
  EXPECT_EQ(t.attr.ah_attr.dlid, 17);
  EXPECT_EQ(t.attr.ah_attr.is_global, 0);
  // No LID: route by GID.
  remote.lid = 0;
  EXPECT_EQ(build_rtr_transition(local, remote, 0).attr.ah_attr.is_global, 1);
}

TEST(RdmaQpAttrs, RtsUsesPingpongTimersAndOurPsn) {
  LocalPath local;
  local.max_rd_atomic = 4;
  const QpTransition t = build_rts_transition(local, remote_record(), 0x777);
  EXPECT_EQ(t.attr.qp_state, IBV_QPS_RTS);
  EXPECT_EQ(t.attr.timeout, 14);
  EXPECT_EQ(t.attr.retry_cnt, 7);
  EXPECT_EQ(t.attr.rnr_retry, 7);
  EXPECT_EQ(t.attr.sq_psn, 0x777u);
  EXPECT_EQ(t.attr.max_rd_atomic, 4);
  EXPECT_EQ(t.mask, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

TEST(RdmaQpAttrs, RdAtomicIsTheMinimumAndAtLeastOne) {
  LocalPath local;
  proto::RdmaHandshake remote = remote_record();
  local.max_rd_atomic = 16;
  remote.max_rd_atomic = 2;
  EXPECT_EQ(negotiated_rd_atomic(local, remote), 2);
  local.max_rd_atomic = 0;
  EXPECT_EQ(negotiated_rd_atomic(local, remote), 1);
}

}  // namespace
}  // namespace pdr::transfer::rdma
