// The replay socket's answers in both layouts vLLM has shipped: with the topic frame (vLLM >= 0.26)
// and without (older vLLM, SGLang), their end markers, and answers of neither shape.
#include "proto/kv_events_replay.h"

#include <gtest/gtest.h>

#include <span>
#include <string>
#include <vector>

#include "proto/kv_events.h"

namespace pdr::proto {
namespace {

// Frames as a DEALER receives them; decode_kv_replay_answer's spans point into `frames`.
struct Answer {
  std::vector<std::string> frames;
  Status decode(KvReplayAnswer* out) const {
    std::vector<std::span<const std::byte>> spans;
    for (const std::string& f : frames) spans.push_back(std::as_bytes(std::span(f.data(), f.size())));
    return decode_kv_replay_answer(spans, out);
  }
};

std::string text(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(KvReplayAnswer, WithTheTopicFrame) {
  const Answer batch{{"", "kv@10.0.0.1@m", encode_kv_event_seq(7), "payload"}};
  KvReplayAnswer a;
  ASSERT_TRUE(batch.decode(&a).is_ok());
  EXPECT_EQ(a.layout, KvReplayLayout::kWithTopic);
  EXPECT_FALSE(a.end);
  EXPECT_EQ(a.seq, 7u);
  EXPECT_EQ(text(a.topic), "kv@10.0.0.1@m");
  EXPECT_EQ(text(a.payload), "payload");

  const Answer empty_topic{{"", "", encode_kv_event_seq(8), "p"}};  // vLLM's default topic is ""
  ASSERT_TRUE(empty_topic.decode(&a).is_ok());
  EXPECT_EQ(a.seq, 8u);
  EXPECT_FALSE(a.end);

  const Answer end{{"", "", encode_kv_event_seq(kKvReplayEnd), ""}};
  ASSERT_TRUE(end.decode(&a).is_ok());
  EXPECT_EQ(a.layout, KvReplayLayout::kWithTopic);
  EXPECT_TRUE(a.end);
}

TEST(KvReplayAnswer, WithoutTheTopicFrame) {
  const Answer batch{{"", encode_kv_event_seq(3), "payload"}};
  KvReplayAnswer a;
  ASSERT_TRUE(batch.decode(&a).is_ok());
  EXPECT_EQ(a.layout, KvReplayLayout::kWithoutTopic);
  EXPECT_FALSE(a.end);
  EXPECT_EQ(a.seq, 3u);
  EXPECT_TRUE(a.topic.empty());
  EXPECT_EQ(text(a.payload), "payload");

  const Answer end{{"", std::string(8, '\xff'), ""}};  // vLLM: (-1).to_bytes(8, "big", signed=True)
  ASSERT_TRUE(end.decode(&a).is_ok());
  EXPECT_EQ(a.layout, KvReplayLayout::kWithoutTopic);
  EXPECT_TRUE(a.end);
  EXPECT_EQ(a.seq, kKvReplayEnd);
}

TEST(KvReplayAnswer, OtherShapesAreMalformed) {
  const std::string seq = encode_kv_event_seq(1);
  const std::vector<Answer> bad = {
      {{}},
      {{""}},
      {{"", seq}},                            // no payload
      {{"", "t", seq, "p", "extra"}},         // five frames
      {{"x", seq, "p"}},                      // the delimiter is not empty
      {{"x", "t", seq, "p"}},
      {{"", "1234567", "p"}},                 // a 7-byte seq
      {{"", "t", "123456789", "p"}},          // a 9-byte seq
      {{"", seq, "p", "q"}},                  // 4 frames read as with topic: "p" is no seq
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    KvReplayAnswer a;
    EXPECT_EQ(bad[i].decode(&a).code(), StatusCode::kMalformed) << "case " << i;
  }
}

}  // namespace
}  // namespace pdr::proto
