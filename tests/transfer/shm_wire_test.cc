#include "transfer/shm/shm_wire.h"

#include <gtest/gtest.h>

#include <span>

namespace pdr::transfer::shm {
namespace {

std::span<const std::byte> bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(ShmWire, RoundTripsEveryMessage) {
  const std::string stream = encode_hello("a") + encode_region_query(9) +
                             encode_region({.id = 3, .flags = kRegionCma, .length = 10, .addr = 4096}) +
                             encode_regions_end(9) + encode_notify(77, "msg") + encode_notify_ack(77) +
                             encode_region_revoke(3) + encode_revoke_ack(3);
  std::size_t at = 0;
  std::vector<Frame> frames;
  while (at < stream.size()) {
    Frame frame;
    std::size_t consumed = 0;
    ASSERT_TRUE(decode_frame(bytes(stream).subspan(at), &frame, &consumed));
    ASSERT_GT(consumed, 0u);
    frames.push_back(frame);
    at += consumed;
  }
  ASSERT_EQ(frames.size(), 8u);
  EXPECT_EQ(frames[0].text, "a");
  EXPECT_EQ(frames[1].region_id, 9u);
  EXPECT_EQ(frames[2].region.addr, 4096u);
  EXPECT_EQ(frames[3].type, MsgType::kRegionsEnd);
  EXPECT_EQ(frames[4].seq, 77u);
  EXPECT_EQ(frames[4].text, "msg");
  EXPECT_EQ(frames[5].type, MsgType::kNotifyAck);
  EXPECT_EQ(frames[6].type, MsgType::kRegionRevoke);
  EXPECT_EQ(frames[6].region_id, 3u);
  EXPECT_EQ(frames[7].type, MsgType::kRevokeAck);
  EXPECT_EQ(frames[7].region_id, 3u);
}

TEST(ShmWire, IncompleteNeedsMore) {
  const std::string frame = encode_notify(1, "hello");
  for (std::size_t n = 0; n < frame.size(); ++n) {
    Frame out;
    std::size_t consumed = 7;
    ASSERT_TRUE(decode_frame(bytes(frame.substr(0, n)), &out, &consumed)) << n;
    EXPECT_EQ(consumed, 0u);
  }
}

TEST(ShmWire, RefusesBadInput) {
  Frame out;
  std::size_t consumed = 0;
  EXPECT_EQ(decode_frame(bytes("XXXXXXXX"), &out, &consumed).code(), StatusCode::kMalformed);
  std::string big = encode_notify(1, "");
  big[4] = '\xff';
  big[5] = '\xff';
  big[6] = '\xff';
  EXPECT_EQ(decode_frame(bytes(big), &out, &consumed).code(), StatusCode::kTooLarge);
  std::string unknown = encode_notify_ack(1);
  unknown[2] = 99;
  EXPECT_EQ(decode_frame(bytes(unknown), &out, &consumed).code(), StatusCode::kUnknownType);
  unknown[2] = 9;  // one past kRevokeAck
  EXPECT_EQ(decode_frame(bytes(unknown), &out, &consumed).code(), StatusCode::kUnknownType);
  EXPECT_FALSE(decode_frame(bytes(encode_hello("")), &out, &consumed));
  EXPECT_FALSE(decode_frame(bytes(encode_hello(std::string(257, 'a'))), &out, &consumed));
  EXPECT_FALSE(decode_frame(bytes(encode_region({.id = 1, .flags = 3, .length = 1, .addr = 1})), &out, &consumed));
  EXPECT_FALSE(decode_frame(bytes(encode_region({.id = 1, .flags = kRegionCma, .length = 2, .addr = ~0ull})), &out,
                            &consumed));
  EXPECT_FALSE(decode_frame(bytes(encode_region({.id = 0, .flags = kRegionHasFd, .length = 1, .addr = 0})), &out,
                            &consumed));
}

}  // namespace
}  // namespace pdr::transfer::shm
