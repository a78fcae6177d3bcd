// An in-process fake NIC behind the VerbsApi table (docs/design/kv-transfer.md R-16, item c), so the RDMA backend's whole
// data path runs in CI without a device. A test double: it lives in the test-support library
// pdr_transfer_rdma_test_support (tests/CMakeLists.txt), never in a product library; a test hands
// it to the backend with make_rdma_backend(options, rdma::load_fake_verbs_api).
//
// What it models (RC only):
// - One device "fake_rxe0", port 1 (Ethernet, active, MTU 4096), a GID table of a link-local and
//   an IPv4-mapped RoCE v2 entry.
// - MRs with distinct lkey/rkey and access flags; a remote access is checked against the rkey's MR
//   bounds, its REMOTE_READ/REMOTE_WRITE flag and the target QP's PD.
// - QPs walk RESET->INIT->RTR->RTS through modify_qp; post_send needs RTS and a peer QP whose
//   dest_qp_num/rq_psn match our qp_num/sq_psn (else IBV_WC_RETRY_EXC_ERR, as a real unreachable
//   peer would end).
// - post_send executes each WR synchronously, in chain order, under one process-wide mutex:
//   RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ and SEND as memcpy. WRITE_WITH_IMM and SEND consume
//   the peer's oldest posted receive; with none posted the sender gets IBV_WC_RNR_RETRY_EXC_ERR
//   (real hardware with rnr_retry 7 would retry forever; the fake makes a missing receive visible).
// - CQEs: a successful WR produces one only when sq_sig_all or IBV_SEND_SIGNALED; an error always
//   does. The first error moves the QP (and, for remote errors, the peer QP) to ERR; the rest of
//   the chain, later posts and all posted receives complete with IBV_WC_WR_FLUSH_ERR.
// - Error injection: fail the Nth send WR executed from now on, flush (move to ERR) a QP by qpn.
//
// One NIC per process, shared by every table user, so two backends in one test talk through it.
// Thread-safe; every call takes the NIC mutex (TSan-clean: the memcpy into a peer's memory happens
// before that peer's poll_cq returns the CQE that reports it).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <vector>

#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer::rdma {

const VerbsApi* fake_verbs_api();

// A VerbsLoader (verbs_api.h) that always succeeds with fake_verbs_api(): what tests inject where
// production passes load_verbs_api.
Status load_fake_verbs_api(const VerbsApi** out);

struct FakeNicStats {
  std::uint64_t post_send_calls = 0;   // doorbells
  std::uint64_t send_wrs = 0;          // send WRs executed or flushed
  std::uint64_t send_cqes = 0;         // CQEs for send WRs (signaled, errors, flushes)
  std::uint64_t recv_cqes = 0;
  std::uint64_t bytes_moved = 0;       // payload copied by WRITE/READ/SEND
  std::uint64_t cq_overruns = 0;       // CQEs pushed into a full CQ (a backend bug)
  std::uint64_t live_qps = 0;
  std::uint64_t live_mrs = 0;
};

class FakeNic {
 public:
  static FakeNic& instance();

  FakeNicStats stats() const;
  // Counts only: live_qps/live_mrs stay.
  void reset_stats();

  // The nth send WR executed after this call (1 = the next one) fails with `status`, as if the
  // hardware reported it (the QP goes to ERR). 0 disarms.
  void fail_nth_send_wr(std::uint64_t nth, ibv_wc_status status = IBV_WC_RETRY_EXC_ERR);
  // Moves the QP to ERR (flushing its receives). false for an unknown qpn.
  bool flush_qp(std::uint32_t qpn);
  std::vector<std::uint32_t> live_qpns() const;

  // How many devices get_device_list reports (default 1); 0 simulates a host without RDMA.
  void set_device_count(int count);
};

}  // namespace pdr::transfer::rdma
