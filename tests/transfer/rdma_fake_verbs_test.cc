// The fake NIC on its own (tests/support/transfer/rdma/fake_verbs.h): the verbs semantics the
// backend relies on.
#include "tests/support/transfer/rdma/fake_verbs.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "transfer/rdma/qp_attrs.h"

namespace pdr::transfer::rdma {
namespace {

class FakeVerbs : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeNic::instance().set_device_count(1);
    FakeNic::instance().fail_nth_send_wr(0);
    int count = 0;
    ibv_device** list = api_->get_device_list(&count);
    ASSERT_EQ(count, 1);
    ctx_ = api_->open_device(list[0]);
    api_->free_device_list(list);
    pd_ = api_->alloc_pd(ctx_);
    cq_ = api_->create_cq(ctx_, 256, nullptr, nullptr, 0);
    mr_ = api_->reg_mr(pd_, memory_.data(), memory_.size(),
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr_, nullptr);
    a_ = make_qp();
    b_ = make_qp();
  }
  void TearDown() override {
    api_->destroy_qp(a_);
    api_->destroy_qp(b_);
    api_->dereg_mr(mr_);
    api_->destroy_cq(cq_);
    api_->dealloc_pd(pd_);
    api_->close_device(ctx_);
  }

  ibv_qp* make_qp() {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 64;
    init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    return api_->create_qp(pd_, &init);
  }

  proto::RdmaHandshake record(ibv_qp* qp, std::uint32_t psn) {
    proto::RdmaHandshake r;
    r.qpn = {qp->qp_num};
    r.psn = {psn};
    r.max_rd_atomic = 16;
    r.agent = "x";
    return r;
  }

  // Connects a <-> b with the given PSNs (b is told a_psn_told_b for a).
  void connect(std::uint32_t a_psn, std::uint32_t a_psn_told_b) {
    LocalPath local;
    for (ibv_qp* qp : {a_, b_}) {
      QpTransition init = build_init_transition(local);
      ASSERT_EQ(api_->modify_qp(qp, &init.attr, init.mask), 0);
    }
    QpTransition rtr = build_rtr_transition(local, record(b_, 5), 0);
    ASSERT_EQ(api_->modify_qp(a_, &rtr.attr, rtr.mask), 0);
    rtr = build_rtr_transition(local, record(a_, a_psn_told_b), 0);
    ASSERT_EQ(api_->modify_qp(b_, &rtr.attr, rtr.mask), 0);
    QpTransition rts = build_rts_transition(local, record(b_, 5), a_psn);
    ASSERT_EQ(api_->modify_qp(a_, &rts.attr, rts.mask), 0);
    rts = build_rts_transition(local, record(a_, a_psn), 5);
    ASSERT_EQ(api_->modify_qp(b_, &rts.attr, rts.mask), 0);
  }

  int post_write(std::uint64_t id, std::size_t from, std::size_t to, std::uint32_t length,
                 unsigned flags, std::uint32_t rkey, ibv_send_wr* next = nullptr,
                 ibv_wr_opcode opcode = IBV_WR_RDMA_WRITE, bool post_now = true) {
    sge_[id % 8] = ibv_sge{reinterpret_cast<std::uintptr_t>(memory_.data() + from), length, mr_->lkey};
    wr_[id % 8] = ibv_send_wr{};
    ibv_send_wr& wr = wr_[id % 8];
    wr.wr_id = id;
    wr.sg_list = &sge_[id % 8];
    wr.num_sge = 1;
    wr.opcode = opcode;
    wr.send_flags = flags;
    wr.next = next;
    wr.wr.rdma.remote_addr = reinterpret_cast<std::uintptr_t>(memory_.data() + to);
    wr.wr.rdma.rkey = rkey;
    if (!post_now) return 0;  // chained by the caller
    ibv_send_wr* bad = nullptr;
    return api_->post_send(a_, &wr, &bad);
  }

  std::vector<ibv_wc> drain() {
    std::vector<ibv_wc> out(64);
    out.resize(static_cast<std::size_t>(api_->poll_cq(cq_, 64, out.data())));
    return out;
  }

  const VerbsApi* api_ = fake_verbs_api();
  std::vector<std::byte> memory_ = std::vector<std::byte>(1 << 16);
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
  ibv_sge sge_[8];
  ibv_send_wr wr_[8];
};

TEST_F(FakeVerbs, PostBeforeRtsIsRefused) {
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(api_->post_send(a_, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
}

TEST_F(FakeVerbs, UnsignaledWritesProduceNoCqe) {
  connect(7, 7);
  std::memset(memory_.data(), 0xab, 100);
  ASSERT_EQ(post_write(1, 0, 1000, 100, 0, mr_->rkey), 0);
  EXPECT_TRUE(drain().empty());
  EXPECT_EQ(std::to_integer<int>(memory_[1099]), 0xab);
  ASSERT_EQ(post_write(2, 0, 2000, 100, IBV_SEND_SIGNALED, mr_->rkey), 0);
  const auto wcs = drain();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
}

TEST_F(FakeVerbs, RemoteAccessErrorFlushesTheRestOfTheChain) {
  connect(7, 7);
  constexpr auto kWrite = IBV_WR_RDMA_WRITE;
  post_write(3, 0, 300, 10, 0, mr_->rkey, nullptr, kWrite, false);  // fine, but after the error
  post_write(2, 0, memory_.size() - 5, 10, 0, mr_->rkey, &wr_[3], kWrite, false);  // out of bounds
  post_write(1, 0, 100, 10, 0, mr_->rkey, &wr_[2], kWrite, false);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(api_->post_send(a_, &wr_[1], &bad), 0);
  const auto wcs = drain();
  // b's QP goes to ERR too: nothing posted on it, so only a's CQEs.
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wcs[1].wr_id, 3u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(FakeVerbs, WrongRkeyOrPsnFails) {
  connect(7, 8);  // b expects PSN 8, a starts at 7
  ASSERT_EQ(post_write(1, 0, 100, 10, 0, mr_->rkey), 0);
  auto wcs = drain();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(FakeVerbs, SendNeedsAPostedReceive) {
  connect(7, 7);
  ASSERT_EQ(post_write(1, 0, 0, 8, 0, 0, nullptr, IBV_WR_SEND), 0);
  auto wcs = drain();
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
}

TEST_F(FakeVerbs, SendLandsInTheReceiveBuffer) {
  connect(7, 7);
  ibv_sge sge{reinterpret_cast<std::uintptr_t>(memory_.data() + 4096), 64, mr_->lkey};
  ibv_recv_wr recv{};
  recv.wr_id = 99;
  recv.sg_list = &sge;
  recv.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(api_->post_recv(b_, &recv, &bad), 0);
  std::memcpy(memory_.data(), "hello", 5);
  ASSERT_EQ(post_write(1, 0, 0, 5, IBV_SEND_SIGNALED, 0, nullptr, IBV_WR_SEND), 0);
  auto wcs = drain();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 99u);  // the receive
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RECV);
  EXPECT_EQ(wcs[0].byte_len, 5u);
  EXPECT_EQ(wcs[1].wr_id, 1u);
  EXPECT_EQ(std::memcmp(memory_.data() + 4096, "hello", 5), 0);
}

TEST_F(FakeVerbs, InjectedFailureAndFlush) {
  connect(7, 7);
  FakeNic::instance().fail_nth_send_wr(2, IBV_WC_RETRY_EXC_ERR);
  ASSERT_EQ(post_write(1, 0, 100, 10, 0, mr_->rkey), 0);
  ASSERT_EQ(post_write(2, 0, 100, 10, 0, mr_->rkey), 0);
  ASSERT_EQ(post_write(3, 0, 100, 10, 0, mr_->rkey), 0);
  auto wcs = drain();
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);  // posting to an ERR QP flushes
  EXPECT_TRUE(FakeNic::instance().flush_qp(b_->qp_num));
  EXPECT_FALSE(FakeNic::instance().flush_qp(0xffffff));
}

}  // namespace
}  // namespace pdr::transfer::rdma
