// vLLM KV cache events (`--kv-events-config`, publisher "zmq"): the ZMQ frames of one published
// batch, its msgpack payload, and the replay socket's request and answer frames. Pure; no I/O.
// Wire facts: docs/design/kv-events.md (vllm/distributed/kv_events.py).
//
// Frames of a published message: [topic, seq, payload]; topic is the configured topic (default
// empty), seq an 8-byte big-endian counter from 0 per publisher process, payload a msgpack batch.
// Replay (ROUTER bound on replay_endpoint): a DEALER sends ["", start_seq(8B BE)] and gets the
// buffered batches from start_seq on, then an end marker, in one of two layouts (with or without
// the topic frame): proto/kv_events_replay.h.
//
// Payload shapes decoded, every one vLLM has shipped:
//   - batch: [ts, events] (older) or [ts, events, dp_rank|nil]; also a map {"ts", "events",
//     "data_parallel_rank"} (msgspec's encoding of the batch struct without array_like);
//   - events as positional arrays tagged first (["BlockStored", block_hashes, parent_block_hash,
//     token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx,
//     kv_cache_spec_kind, kv_cache_spec_sliding_window], trailing fields added over versions:
//     a shorter array leaves the later fields unset) or as maps tagged by "type" (vLLM >= 0.26,
//     vllm-project/vllm#42892); trailing positional fields and map keys beyond those below are
//     ignored and counted (unknown_fields), never fatal ("ownership" and "session_id", which
//     newer offloading events carry, are known and ignored);
//   - block hashes as unsigned integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default: the
//     digest's low 64 bits) or raw digest bytes (=0): both are folded to the same uint64 (the last
//     8 bytes, big-endian, which is what vLLM's integer form is), so an index keyed by EngineHash
//     matches whichever mode the engine runs in.
// An empty event list is a valid batch (nothing changed). Unknown event types are skipped and
// counted (unknown_events). A known event whose fields have the wrong type or break a limit fails
// the whole batch: a consumer applying events in order must not apply a batch with a hole in it
// (treat it as a gap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

// An engine block hash, whichever encoding the engine used (see above).
using EngineHash = uint64_t;

struct KvEventLimits {
  size_t max_payload_bytes = 16 * 1024 * 1024;  // one batch
  size_t max_events = 65536;                    // per batch
  size_t max_blocks = 65536;                    // block_hashes (and extra_keys) per event
  size_t max_tokens = 1u << 20;                 // token_ids per event
  size_t max_hash_bytes = 64;                   // a raw digest (sha256: 32)
  size_t max_string_bytes = 256;                // medium, lora_name, kinds, type tags
};

// group_idx is a KV cache group's index in the engine's KV cache config: a small number.
inline constexpr int64_t kMaxKvGroupIdx = 65535;

enum class KvEventKind { kBlockStored, kBlockRemoved, kAllBlocksCleared };

struct KvEvent {
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  std::vector<EngineHash> block_hashes;          // stored / removed
  std::optional<EngineHash> parent_block_hash;   // stored: the block before the first; none at start
  // stored: every token of the stored blocks, block_size per block (empty for CPU offload
  // events). Not checked against block_hashes x block_size here: a consumer hashing tokens per
  // block checks that itself and skips an event that does not add up.
  std::vector<uint32_t> token_ids;
  // stored: tokens per block; 0 when the event describes no tokens (an offload tier's
  // placeholder BlockStored: engine keys and a tier only).
  uint32_t block_size = 0;
  std::string medium;                            // "GPU", "CPU", "STORAGE", ... (empty when not sent)
  // "LOCAL" / "REMOTE": where the tier is, relative to the publisher (newer offloading events).
  std::optional<std::string> locality;
  std::optional<int64_t> lora_id;                // stored: the adapter's id (deprecated upstream)
  std::optional<std::string> lora_name;          // stored: the adapter's name
  // stored: per block, the extra keys the engine hashed into the block (multimodal identifiers,
  // cache_salt on the first block, prompt-embedding digests) OTHER than the LoRA adapter's own
  // entry (which lora_name / lora_id already name), in canonical form (kv_extra_keys_of below);
  // "" for a block with none. Empty when no block has any; else one entry per entry the event
  // sent (not checked against block_hashes here, as token_ids is not).
  std::vector<std::string> extra_keys;
  std::optional<int64_t> group_idx;              // KV cache group (hybrid models), 0..kMaxKvGroupIdx
  // stored: the group's KV cache spec (vLLM's KVCacheSpecKind value: "full_attention",
  // "sliding_window", "mamba", ...) and its sliding window in tokens, when the engine says.
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> kv_cache_spec_sliding_window;

  bool has_extra_keys() const { return !extra_keys.empty(); }
};

struct KvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;  // known events, in order
  std::optional<int64_t> dp_rank;
  size_t unknown_events = 0;    // events of a type not listed in KvEventKind, skipped
  size_t unknown_fields = 0;    // map keys / trailing positional fields not read
};

// The canonical form of one block's extra keys (the KvEvent::extra_keys entries): the msgpack
// array of the keys, re-encoded by this library (smallest integer and length headers), so the
// same keys give the same bytes whichever encoder the engine used. A router that knows a
// request's extra keys builds the same bytes with the functions below.
//
// The first block's extra keys of a request that carries vLLM's `cache_salt` (and no
// multimodal input or prompt embeddings): ["<salt>"].
std::string kv_extra_keys_for_cache_salt(std::string_view salt);

// Decodes one payload. Errors: kTooLarge, kTooDeep, kMalformed (not msgpack, trailing bytes),
// kWrongType / kOutOfRange / kMissingKey naming the event index and field.
Status decode_kv_event_batch(std::span<const std::byte> payload, const KvEventLimits& limits,
                             KvEventBatch* out);

// The seq frame: exactly 8 bytes, big-endian. kMalformed otherwise.
Status decode_kv_event_seq(std::span<const std::byte> frame, uint64_t* out);
// The end-of-replay marker's seq (-1 as a signed 8-byte big-endian integer).
inline constexpr uint64_t kKvReplayEnd = ~uint64_t{0};
// The 8-byte big-endian seq frame (a replay request's start_seq).
std::string encode_kv_event_seq(uint64_t seq);

}  // namespace pdr::proto
