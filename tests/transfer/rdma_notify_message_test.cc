// The RDMA backend's QP-0 notify/reply codec (transfer/rdma/notify_message.h).
#include "transfer/rdma/notify_message.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

namespace pdr::transfer::rdma {
namespace {

TEST(RdmaNotifyMessage, RoundTripsNotifyAndReply) {
  std::array<std::byte, 64> buffer{};
  const std::size_t size =
      encode_notify_message({NotifyType::kNotify, 0, 0x0102030405060708ull, "req-7"}, buffer);
  ASSERT_EQ(size, kNotifyHeaderBytes + 5);
  EXPECT_EQ(std::to_integer<int>(buffer[0]), 1);
  EXPECT_EQ(std::to_integer<int>(buffer[4]), 5);     // length, little-endian
  EXPECT_EQ(std::to_integer<int>(buffer[8]), 0x08);  // xfer_id, little-endian
  NotifyMessage out;
  ASSERT_TRUE(decode_notify_message(std::span(buffer.data(), size), &out));
  EXPECT_EQ(out.type, NotifyType::kNotify);
  EXPECT_EQ(out.xfer_id, 0x0102030405060708ull);
  EXPECT_EQ(out.message, "req-7");

  ASSERT_EQ(encode_notify_message({NotifyType::kReply, 3, 9, {}}, buffer), kNotifyHeaderBytes);
  ASSERT_TRUE(decode_notify_message(std::span(buffer.data(), kNotifyHeaderBytes), &out));
  EXPECT_EQ(out.type, NotifyType::kReply);
  EXPECT_EQ(out.status, 3);
  EXPECT_EQ(out.xfer_id, 9u);
  EXPECT_TRUE(out.message.empty());
}

TEST(RdmaNotifyMessage, EncodeRefusesASmallBuffer) {
  std::array<std::byte, kNotifyHeaderBytes + 2> buffer{};
  EXPECT_EQ(encode_notify_message({NotifyType::kNotify, 0, 1, "abc"}, buffer), 0u);
}

TEST(RdmaNotifyMessage, DecodeRejectsMalformed) {
  std::array<std::byte, 64> buffer{};
  const std::size_t size = encode_notify_message({NotifyType::kNotify, 0, 1, "abc"}, buffer);
  NotifyMessage out;
  EXPECT_FALSE(decode_notify_message(std::span(buffer.data(), kNotifyHeaderBytes - 1), &out));
  EXPECT_FALSE(decode_notify_message(std::span(buffer.data(), size - 1), &out));  // truncated
  EXPECT_FALSE(decode_notify_message(std::span(buffer.data(), size + 1), &out));  // trailing
  auto bad = buffer;
  bad[0] = std::byte{3};  // unknown type
  EXPECT_FALSE(decode_notify_message(std::span(bad.data(), size), &out));
  bad = buffer;
  bad[2] = std::byte{1};  // reserved must be zero
  EXPECT_FALSE(decode_notify_message(std::span(bad.data(), size), &out));
}

}  // namespace
}  // namespace pdr::transfer::rdma
