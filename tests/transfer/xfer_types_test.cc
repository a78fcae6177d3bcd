#include "transfer/core/xfer_types.h"

#include <gtest/gtest.h>

#include "transfer/core/region_table.h"

namespace pdr::transfer {
namespace {

TEST(XferTypes, Labels) {
  EXPECT_EQ(xfer_op_label(XferOp::kRead), "read");
  EXPECT_EQ(xfer_state_label(XferState::kCancelled), "cancelled");
  EXPECT_EQ(xfer_cause_label(XferCause::kPeerGone), "peer_gone");
  EXPECT_EQ(xfer_cause_label(XferCause::kBadFrame), "bad_frame");
  EXPECT_EQ(mem_kind_label(MemKind::kHostShared), "host_shared");
  EXPECT_TRUE(is_final(XferState::kFailed));
  EXPECT_FALSE(is_final(XferState::kPending));
}

}  // namespace
}  // namespace pdr::transfer
