#include "proto/kv_events_replay.h"

#include <string>

#include "proto/kv_events.h"

namespace pdr::proto {

Status decode_kv_replay_answer(std::span<const std::span<const std::byte>> frames,
                               KvReplayAnswer* out) {
  *out = KvReplayAnswer{};
  if (frames.size() != 3 && frames.size() != 4) {
    return Status(StatusCode::kMalformed,
                  "a KV events replay answer has 3 or 4 frames, got " + std::to_string(frames.size()));
  }
  if (!frames[0].empty()) {
    return Status(StatusCode::kMalformed, "a KV events replay answer starts with an empty frame");
  }
  const bool with_topic = frames.size() == 4;
  out->layout = with_topic ? KvReplayLayout::kWithTopic : KvReplayLayout::kWithoutTopic;
  const size_t seq_at = with_topic ? 2 : 1;
  if (Status s = decode_kv_event_seq(frames[seq_at], &out->seq); !s) return s;
  if (with_topic) out->topic = frames[1];
  out->payload = frames[seq_at + 1];
  out->end = out->seq == kKvReplayEnd;
  return Status::ok();
}

}  // namespace pdr::proto
