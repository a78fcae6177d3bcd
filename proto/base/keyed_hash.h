// A keyed hash for hash tables whose keys an untrusted peer chooses.
//
// std::hash<uint64_t> is the identity in libstdc++, and its bucket counts are a fixed, public
// sequence of primes (13, 29, 59, ..., 172933, 351061, ...): a peer that sends keys which are
// multiples of the current bucket count puts every key in one bucket, and each insert then walks
// a chain as long as the table (quadratic work, "hash flooding"). KeyedHash64 maps a key through
// SipHash-2-4 (Aumasson and Bernstein, a keyed pseudo-random function) under a 128-bit secret
// drawn from getrandom(2) once per process: without the secret a peer cannot tell which keys
// share a bucket, whatever keys it sends and whatever bucket counts it knows.
//
// Cost: one SipHash-2-4 of 8 bytes (8 rounds of add-rotate-xor, a few tens of nanoseconds).
// Thread-safe: the secret is drawn on first use (a function-local static) and never changes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pdr {

struct SipKey {
  uint64_t k0 = 0;  // the key's bytes 0..7, little-endian
  uint64_t k1 = 0;  // bytes 8..15
};

// SipHash-2-4 of the 8 bytes of `value` in little-endian order (the reference implementation's
// message of length 8) under `key`.
uint64_t siphash24_u64(uint64_t value, const SipKey& key) noexcept;

// This process's secret: 16 bytes from getrandom(2) (or /dev/urandom), drawn on the first call.
// Aborts the process if the kernel supplies neither (no silent fallback to a guessable key); an
// owner may call it at start-up so that happens before any traffic.
const SipKey& process_hash_key();

// The hasher for std::unordered_map<uint64_t, ...> (and sets) keyed by untrusted 64-bit values.
// Deliberately not noexcept: libstdc++ then stores each element's hash code in its node, so a
// rehash or a walk along a bucket never hashes again (and the node size stays in the same malloc
// size class for the maps pdrouter keeps; see router/cache/block_index.h).
struct KeyedHash64 {
  size_t operator()(uint64_t value) const { return siphash24_u64(value, process_hash_key()); }
};

}  // namespace pdr
