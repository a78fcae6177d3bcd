// The answers of vLLM's KV events replay socket (a ROUTER bound on the publisher's
// replay_endpoint; proto/kv_events.h has the live messages). Pure; no I/O.
//
// A subscriber's DEALER asks with ["", start_seq (8 bytes big-endian)] and gets one message per
// buffered batch with seq >= start_seq, then an end marker. Two layouts are in use, as a DEALER
// sees them (the ROUTER's identity frame already stripped):
//   - with topic (vLLM >= 0.26, vllm-project/vllm#45177: replayed batches carry the topic frame
//     of live messages): ["", topic, seq, payload]; end marker ["", "", END, ""];
//   - without (older vLLM; SGLang's publisher): ["", seq, payload]; end marker ["", END, ""].
// END is seq -1 as a signed 8-byte big-endian integer (kKvReplayEnd); it ends the answer whatever
// the frames around it hold (vLLM's are empty). The frame count tells the layouts apart, so one
// reader takes either from any node.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/base/status.h"

namespace pdr::proto {

enum class KvReplayLayout { kWithTopic, kWithoutTopic };

struct KvReplayAnswer {
  KvReplayLayout layout = KvReplayLayout::kWithTopic;
  bool end = false;                    // the end marker: no batch
  uint64_t seq = 0;                    // the batch's seq (end: kKvReplayEnd)
  std::span<const std::byte> topic;    // with topic only; points into the frames
  std::span<const std::byte> payload;  // the msgpack batch; points into the frames
};

// One answer's frames, delimiter first. kMalformed: not 3 or 4 frames, a non-empty delimiter or
// a seq frame that is not 8 bytes.
Status decode_kv_replay_answer(std::span<const std::span<const std::byte>> frames,
                               KvReplayAnswer* out);

}  // namespace pdr::proto
