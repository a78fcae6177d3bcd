// Synthetic KV-cache bytes for `pdnode sim`: what a prefill "computes" and a decode must receive.
//
// The content of (logical block i, layer l) of one request is a splitmix64 stream seeded from the
// request's transfer key, its prompt text, i and l. Both legs know the key (the dialect's
// transfer_id, else the X-Request-Id both legs share; proto/REQUEST_LEGS.md) and the prompt, so
// the decode can check every byte it received; two requests differ in key, so a transfer paired
// with the wrong request is detected. Pure functions, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace pdr::node::sim {

// One request's content seed (FNV-1a over key, a separator and the prompt, then mixed).
uint64_t kv_content_seed(std::string_view transfer_key, std::string_view prompt);

// Fills `out` with the bytes of (block, layer). Any length works; a block's bytes do not depend on
// the block size beyond truncation, so both sides agree whenever their --kv-block-bytes agree.
void fill_kv_block(uint64_t seed, uint32_t block, uint32_t layer, std::span<std::byte> out);

// The offset of the first byte of `got` that differs from fill_kv_block's, or nullopt when all
// match.
std::optional<size_t> check_kv_block(uint64_t seed, uint32_t block, uint32_t layer,
                                     std::span<const std::byte> got);

}  // namespace pdr::node::sim
