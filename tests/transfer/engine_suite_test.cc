// The shared engine suite: the same behaviour asked of every backend (tcp, shm, the RDMA backend
// over the fake verbs NIC, and tcp behind the fault-injecting wrapper with no faults planned), two
// engines in this process talking over real sockets (tcp, the rdma control channel) or real shared
// memory (shm). Random data is checked byte for byte after every transfer.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string_view>
#include <thread>

#include "tests/support/time_scale.h"
#include "tests/support/transfer/test_backends.h"
#include "transfer/backend_factory.h"
#include "transfer/engine.h"

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;
using pdr::test::scaled;

constexpr std::uint32_t kBlocks = 256;
constexpr std::uint64_t kBlockBytes = 16 * 1024;
constexpr std::uint32_t kLayers = 2;

struct SuiteParam {
  const char* name;
  const char* backends;
  bool fake_verbs = false;
  const char* faults = "";
};

struct Side {
  std::unique_ptr<Engine> engine;
  RegionId region = kInvalidRegion;
  std::byte* base = nullptr;
  LayoutId layout = 0;
};

class EngineSuite : public ::testing::TestWithParam<SuiteParam> {
 protected:
  Side make_side(const std::string& agent) {
    Side side;
    std::vector<BackendKind> kinds;
    EXPECT_TRUE(parse_backend_list(GetParam().backends, &kinds).is_ok());
    TestBackendSettings settings;
    settings.rdma_fake_verbs = GetParam().fake_verbs;
    settings.faults = GetParam().faults;
    std::vector<std::unique_ptr<Backend>> backends;
    Status s = make_test_backends(kinds, settings, &backends);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    s = Engine::create({.agent = agent}, std::move(backends), &side.engine);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s) return side;
    // Layer-major pool: layer l holds every block of that layer.
    const std::uint64_t layer_bytes = kBlocks * kBlockBytes;
    EXPECT_TRUE(side.engine->allocate_region(layer_bytes * kLayers, &side.region, &side.base).is_ok());
    EXPECT_TRUE(side.engine
                    ->define_layout({.region = side.region, .block_bytes = kBlockBytes,
                                     .stride = kBlockBytes, .block_count = kBlocks,
                                     .layers = kLayers, .layer_stride = layer_bytes},
                                    &side.layout)
                    .is_ok());
    return side;
  }

  void SetUp() override {
    a_ = make_side(std::string("a-") + GetParam().name);
    b_ = make_side(std::string("b-") + GetParam().name);
    ASSERT_NE(a_.engine, nullptr);
    ASSERT_NE(b_.engine, nullptr);
    ASSERT_TRUE(a_.engine->import_peer(b_.engine->export_local(), &b_from_a_).is_ok());
    ASSERT_TRUE(b_.engine->import_peer(a_.engine->export_local(), &a_from_b_).is_ok());
    const std::string expected = std::string(GetParam().backends).substr(0, 3);
    ASSERT_EQ(a_.engine->peer_backend(b_from_a_), expected.starts_with("rdm") ? "rdma" : expected);
    fill_random(a_, 1);
    fill_random(b_, 2);
  }

  static void fill_random(const Side& side, std::uint32_t seed) {
    std::mt19937_64 rng(seed);
    auto* words = reinterpret_cast<std::uint64_t*>(side.base);
    for (std::uint64_t i = 0; i < kBlocks * kBlockBytes * kLayers / 8; ++i) words[i] = rng();
  }

  static const std::byte* block(const Side& side, std::uint32_t id, std::uint32_t layer) {
    return side.base + layer * kBlocks * kBlockBytes + id * kBlockBytes;
  }

  // Every layer of dst[i] in `to` equals src[i] in `from`.
  static ::testing::AssertionResult same_blocks(const Side& from, std::span<const std::uint32_t> src,
                                                const Side& to, std::span<const std::uint32_t> dst) {
    for (std::size_t i = 0; i < src.size(); ++i) {
      for (std::uint32_t layer = 0; layer < kLayers; ++layer) {
        if (std::memcmp(block(from, src[i], layer), block(to, dst[i], layer), kBlockBytes) != 0) {
          return ::testing::AssertionFailure()
                 << "block " << src[i] << " -> " << dst[i] << " layer " << layer << " differs";
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  XferResult run(Side& side, const BlockXfer& xfer) {
    Completion done;
    Status s = side.engine->submit(xfer, &done);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s) return {XferState::kFailed, XferCause::kInternal, 0};
    return done.wait_for(scaled(20s));
  }

  BlockXfer write_ab(std::span<const std::uint32_t> src, std::span<const std::uint32_t> dst) {
    return BlockXfer{XferOp::kWrite, b_from_a_, a_.layout, src, b_.layout, dst};
  }
  BlockXfer read_ab(std::span<const std::uint32_t> dst, std::span<const std::uint32_t> src) {
    return BlockXfer{XferOp::kRead, b_from_a_, a_.layout, dst, b_.layout, src};
  }

  Side a_, b_;
  PeerId b_from_a_ = kInvalidPeer;
  PeerId a_from_b_ = kInvalidPeer;
};

TEST_P(EngineSuite, WritesAndReadsRandomBlocks) {
  // Runs that coalesce (0-3 -> 10-13), scattered ids, and a reversed order.
  const std::uint32_t src[] = {0, 1, 2, 3, 40, 7, 99, 98};
  const std::uint32_t dst[] = {10, 11, 12, 13, 200, 5, 60, 61};
  XferResult r = run(a_, write_ab(src, dst));
  EXPECT_EQ(r.state, XferState::kDone) << xfer_cause_label(r.cause);
  EXPECT_EQ(r.bytes_done, std::size(src) * kBlockBytes * kLayers);
  EXPECT_TRUE(same_blocks(a_, src, b_, dst));

  const std::uint32_t back_src[] = {100, 101, 150};
  const std::uint32_t back_dst[] = {250, 251, 17};
  r = run(a_, read_ab(back_dst, back_src));
  EXPECT_EQ(r.state, XferState::kDone) << xfer_cause_label(r.cause);
  EXPECT_TRUE(same_blocks(b_, back_src, a_, back_dst));
  EXPECT_GE(a_.engine->counters().xfers_done.load(), 2u);
}

TEST_P(EngineSuite, OneLayerOnly) {
  const std::uint32_t ids[] = {30, 31};
  BlockXfer xfer = write_ab(ids, ids);
  xfer.first_layer = 1;
  xfer.layer_count = 1;
  ASSERT_EQ(run(a_, xfer).state, XferState::kDone);
  EXPECT_NE(std::memcmp(block(a_, 30, 0), block(b_, 30, 0), kBlockBytes), 0) << "layer 0 untouched";
  EXPECT_EQ(std::memcmp(block(a_, 30, 1), block(b_, 30, 1), kBlockBytes), 0);
}

TEST_P(EngineSuite, LargeRawTransferIsCutAndStriped) {
  // 8 MiB in one raw segment: the engine cuts it at max_segment_bytes (4 MiB).
  const std::uint64_t bytes = 8u << 20;
  const RawSegment segment{a_.region, 0, b_.region, 0, bytes};
  Completion done;
  ASSERT_TRUE(a_.engine->submit(RawXfer{XferOp::kWrite, b_from_a_, {&segment, 1}}, &done).is_ok());
  ASSERT_EQ(done.wait_for(scaled(30s)).state, XferState::kDone);
  EXPECT_EQ(std::memcmp(a_.base, b_.base, bytes), 0);
}

TEST_P(EngineSuite, ManyConcurrentBatches) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 40;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // Thread t writes blocks [t*64, t*64+64) of A into the same ids of B, in batches of 1..8 ids.
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kPerThread; ++i) {
        std::vector<std::uint32_t> ids(1 + rng() % 8);
        for (auto& id : ids) id = static_cast<std::uint32_t>(t * 64 + rng() % 64);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        Completion done;
        const XferOp op = i % 2 == 0 ? XferOp::kWrite : XferOp::kRead;
        Status s = a_.engine->submit(
            BlockXfer{op, b_from_a_, a_.layout, ids, b_.layout, ids}, &done);
        if (!s || done.wait_for(scaled(20s)).state != XferState::kDone) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  // After the last WRITE/READ round trip every touched block is equal on both sides.
  std::vector<std::uint32_t> all(kBlocks);
  for (std::uint32_t i = 0; i < kBlocks; ++i) all[i] = i;
  std::vector<std::uint32_t> touched;
  for (std::uint32_t id : all) {
    if (std::memcmp(block(a_, id, 0), block(b_, id, 0), kBlockBytes) == 0) touched.push_back(id);
  }
  EXPECT_TRUE(same_blocks(a_, touched, b_, touched));
  EXPECT_GT(touched.size(), 32u);
  EXPECT_EQ(a_.engine->in_flight(), 0u);
}

TEST_P(EngineSuite, NotificationArrivesAfterTheData) {
  const std::uint32_t src[] = {3, 4, 5};
  const std::uint32_t dst[] = {70, 71, 72};
  BlockXfer xfer = write_ab(src, dst);
  xfer.notify = "req-42";
  Completion done;
  ASSERT_TRUE(a_.engine->submit(xfer, &done).is_ok());
  std::string from;
  ASSERT_TRUE(b_.engine->wait_notification("req-42", Clock::now() + scaled(20s), &from));
  EXPECT_EQ(from, a_.engine->agent());
  // The notification implies the data is visible: check before even looking at the completion.
  EXPECT_TRUE(same_blocks(a_, src, b_, dst));
  EXPECT_EQ(done.wait_for(scaled(20s)).state, XferState::kDone);

  // A bare notification, and one after a READ (the decode telling the prefill it may free).
  Completion bare;
  ASSERT_TRUE(b_.engine->notify(a_from_b_, "free:7", &bare).is_ok());
  EXPECT_TRUE(a_.engine->wait_notification("free:7", Clock::now() + scaled(20s)));
  EXPECT_EQ(bare.wait_for(scaled(20s)).state, XferState::kDone);
  BlockXfer read = read_ab(dst, src);
  read.notify = "pulled";
  EXPECT_EQ(run(a_, read).state, XferState::kDone);
  EXPECT_TRUE(b_.engine->wait_notification("pulled", Clock::now() + scaled(20s)));
}

TEST_P(EngineSuite, CancelAndDeadlineNeverHang) {
  const std::uint64_t bytes = kBlocks * kBlockBytes * kLayers;  // 8 MiB
  const RawSegment segment{a_.region, 0, b_.region, 0, bytes};
  for (int i = 0; i < 5; ++i) {
    Completion done;
    XferId id = 0;
    ASSERT_TRUE(
        a_.engine->submit(RawXfer{XferOp::kRead, b_from_a_, {&segment, 1}}, &done, &id).is_ok());
    (void)a_.engine->cancel(id);  // may already be done: kNotFound is fine
    const XferResult r = done.wait_for(scaled(20s));
    ASSERT_NE(r.state, XferState::kPending) << "cancel must finish the transfer";
    if (r.state != XferState::kDone) {
      EXPECT_EQ(r.cause, XferCause::kCancelled);
    }
  }
  Completion late;
  RawXfer timed{XferOp::kWrite, b_from_a_, {&segment, 1}};
  timed.deadline = Clock::now();  // already due
  ASSERT_TRUE(a_.engine->submit(timed, &late).is_ok());
  const XferResult r = late.wait_for(scaled(20s));
  ASSERT_NE(r.state, XferState::kPending);
  if (r.state != XferState::kDone) {
    EXPECT_EQ(r.cause, XferCause::kTimeout);
  }
  // The engine is still fully usable afterwards.
  const std::uint32_t ids[] = {9};
  EXPECT_EQ(run(a_, write_ab(ids, ids)).state, XferState::kDone);
}

TEST_P(EngineSuite, PeerDyingFailsTransfersWithoutHanging) {
  const std::uint64_t bytes = kBlocks * kBlockBytes * kLayers;
  const RawSegment segment{a_.region, 0, b_.region, 0, bytes};
  Completion in_flight;
  ASSERT_TRUE(
      a_.engine->submit(RawXfer{XferOp::kWrite, b_from_a_, {&segment, 1}}, &in_flight).is_ok());
  b_.engine.reset();  // the peer process "dies" mid-transfer
  const XferResult first = in_flight.wait_for(scaled(20s));
  ASSERT_NE(first.state, XferState::kPending);
  if (first.state != XferState::kDone) {
    EXPECT_EQ(first.cause, XferCause::kPeerGone);
  }
  // shm learns of the death from the socket's hang-up on its I/O thread, while the peer's memfds
  // stay mapped: until then a copy still lands in them and finishes kDone. Wait for that thread to
  // have dropped the peer (it counts the disconnect after marking the peer gone).
  if (std::string_view(GetParam().name) == "shm") {
    const auto deadline = std::chrono::steady_clock::now() + scaled(20s);
    while (a_.engine->counters().disconnects.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    ASSERT_GE(a_.engine->counters().disconnects.load(), 1u) << "the peer's hang-up was never noticed";
  }
  // Later transfers to the dead peer fail; none hangs (tcp: after its 2 s connect timeout).
  for (int i = 0; i < 2; ++i) {
    const std::uint32_t ids[] = {1};
    Completion done;
    Status s = a_.engine->submit(
        BlockXfer{XferOp::kRead, b_from_a_, a_.layout, ids, b_.layout, ids}, &done);
    if (!s) continue;  // refused up front is fine too
    const XferResult r = done.wait_for(scaled(20s));
    EXPECT_EQ(r.state, XferState::kFailed);
    EXPECT_EQ(r.cause, XferCause::kPeerGone);
  }
}

TEST_P(EngineSuite, PeerRefusesAccessOutsideItsRegions) {
  // Lie to A about B's region size, so A's own check passes and B's must refuse.
  proto::TransferDescriptor forged;
  const std::string blob = b_.engine->export_local();
  ASSERT_TRUE(proto::decode_descriptor(std::as_bytes(std::span(blob.data(), blob.size())), {},
                                       &forged)
                  .is_ok());
  forged.regions[0].length *= 2;
  PeerId liar = kInvalidPeer;
  ASSERT_TRUE(a_.engine->import_peer(proto::encode_descriptor(forged), &liar).is_ok());
  const std::uint64_t real = kBlocks * kBlockBytes * kLayers;
  for (XferOp op : {XferOp::kWrite, XferOp::kRead}) {
    const RawSegment outside{a_.region, 0, b_.region, real - 4096, 8192};
    Completion done;
    ASSERT_TRUE(a_.engine->submit(RawXfer{op, liar, {&outside, 1}}, &done).is_ok());
    const XferResult r = done.wait_for(scaled(20s));
    EXPECT_EQ(r.state, XferState::kFailed) << xfer_op_label(op);
    EXPECT_EQ(r.cause, XferCause::kAccess) << xfer_op_label(op);
  }
  // The connection (or mapping) still serves good requests.
  const RawSegment inside{a_.region, 0, b_.region, 0, 4096};
  Completion ok;
  ASSERT_TRUE(a_.engine->submit(RawXfer{XferOp::kWrite, liar, {&inside, 1}}, &ok).is_ok());
  EXPECT_EQ(ok.wait_for(scaled(20s)).state, XferState::kDone);
}

INSTANTIATE_TEST_SUITE_P(
    Backends, EngineSuite,
    ::testing::Values(SuiteParam{"tcp", "tcp"}, SuiteParam{"shm", "shm"},
                      SuiteParam{"fake_rdma", "rdma", true},
                      SuiteParam{"tcp_wrapped", "tcp", false, "latency_us=0"}),
    [](const ::testing::TestParamInfo<SuiteParam>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace pdr::transfer
