// Fuzzes proto/kv_events: a node's KV-events publisher is untrusted bytes from the network.
// Properties: no crash, no sanitizer report, nothing thrown; on success every limit holds and
// the counts add up (known + unknown events = the batch's events).
// Seed corpus: tests/fuzz/corpus/kv_events/ (tests/fuzz/make_kv_events_corpus.py: batches in
// the array and map encodings vLLM has shipped, with every field: LoRA, extra keys, KV cache
// groups and their kinds, tiers, offload placeholders, empty batches, the batch as a map).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "proto/kv_events.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdr::proto::KvEventLimits limits;
  limits.max_payload_bytes = 1 << 20;
  limits.max_events = 256;
  limits.max_blocks = 256;
  limits.max_tokens = 4096;
  const auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  pdr::proto::KvEventBatch batch;
  if (pdr::proto::decode_kv_event_batch(bytes, limits, &batch).is_ok()) {
    if (batch.events.size() + batch.unknown_events > limits.max_events) std::abort();
    if (batch.dp_rank && *batch.dp_rank < 0) std::abort();
    for (const auto& e : batch.events) {
      if (e.block_hashes.size() > limits.max_blocks || e.token_ids.size() > limits.max_tokens) std::abort();
      if (e.medium.size() > limits.max_string_bytes) std::abort();
      if (e.lora_name && e.lora_name->size() > limits.max_string_bytes) std::abort();
      if (e.kv_cache_spec_kind && e.kv_cache_spec_kind->size() > limits.max_string_bytes) std::abort();
      if (e.locality && e.locality->size() > limits.max_string_bytes) std::abort();
      if (e.extra_keys.size() > limits.max_blocks) std::abort();
      // Kept only when some block has keys of its own (the adapter's alone are left out).
      if (!e.extra_keys.empty() &&
          std::all_of(e.extra_keys.begin(), e.extra_keys.end(), [](const std::string& k) { return k.empty(); })) {
        std::abort();
      }
      if (e.group_idx && (*e.group_idx < 0 || *e.group_idx > pdr::proto::kMaxKvGroupIdx)) std::abort();
    }
  } else if (!batch.events.empty()) {
    std::abort();  // a failed batch is left empty: nothing of it may be applied
  }
  uint64_t seq = 0;
  if (pdr::proto::decode_kv_event_seq(bytes, &seq).is_ok() && pdr::proto::encode_kv_event_seq(seq).size() != 8) {
    std::abort();
  }
  return 0;
}
