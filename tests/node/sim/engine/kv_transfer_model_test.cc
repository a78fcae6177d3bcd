// The KV transfer model (node/sim/engine/kv_transfer_model.h): latency, per-transfer cap, and a
// node's bandwidth shared by the transfers moving at once.
#include "node/sim/engine/kv_transfer_model.h"

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

TEST(KvTransferModel, AloneATransferTakesLatencyPlusBytesAtItsOwnRate) {
  KvTransferModel m(1.0, 25.0, 50.0);
  m.start(7, 25'000'000, 0.0);  // 25 MB at 25 GB/s: 1 ms
  EXPECT_NEAR(*m.next_completion_ms(), 2.0, 1e-9);
  EXPECT_TRUE(m.advance(1.999).empty());
  EXPECT_EQ(m.advance(2.0), (std::vector<uint64_t>{7}));
  EXPECT_FALSE(m.next_completion_ms().has_value());
}

TEST(KvTransferModel, TransfersMovingTogetherShareTheNodesBandwidth) {
  KvTransferModel m(1.0, 25.0, 50.0);
  // Two fit under 50 GB/s at 25 each; three get 50/3 each.
  m.start(1, 50'000'000, 0.0);
  m.start(2, 50'000'000, 0.0);
  m.start(3, 50'000'000, 0.0);
  EXPECT_TRUE(m.advance(3.99).empty());
  EXPECT_EQ(m.advance(4.0 + 1e-9), (std::vector<uint64_t>{1, 2, 3}));  // 1 + 50 MB / (50/3 GB/s)
}

TEST(KvTransferModel, RatesChangeWhenATransferEnds) {
  KvTransferModel m(0.0, 25.0, 50.0);
  m.start(1, 10'000'000, 0.0);
  m.start(2, 60'000'000, 0.0);
  m.start(3, 60'000'000, 0.0);
  // Three at 50/3 GB/s: 1 is done at 10/(50/3) = 0.6 ms, when 2 and 3 have 50 MB left; then
  // 25 GB/s each: 2 more ms.
  EXPECT_EQ(m.advance(0.6 + 1e-9), (std::vector<uint64_t>{1}));
  EXPECT_TRUE(m.advance(2.59).empty());
  EXPECT_EQ(m.advance(2.6 + 1e-9), (std::vector<uint64_t>{2, 3}));
}

TEST(KvTransferModel, NextCompletionNeverComesAfterTheRealOne) {
  KvTransferModel m(1.0, 25.0, 50.0);
  m.start(1, 25'000'000, 0.0);
  m.start(2, 0, 0.5);  // latency only
  const double first = *m.next_completion_ms();
  EXPECT_LE(first, 1.5 + 1e-9);
  EXPECT_EQ(m.advance(1.5), (std::vector<uint64_t>{2}));
  m.cancel(1, 1.5);
  EXPECT_FALSE(m.next_completion_ms().has_value());
}

}  // namespace
}  // namespace pdr::node::sim
