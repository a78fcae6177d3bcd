// KeyedHash64: SipHash-2-4 under a per-process secret, for hash tables keyed by values a peer
// chooses.
#include "proto/base/keyed_hash.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <unordered_map>
#include <unordered_set>

namespace pdr {
namespace {

// The reference implementation's test vector for an 8-byte message (github.com/veorq/SipHash,
// vectors.h, vectors_sip64[8]): key 00 01 .. 0f, message 00 01 .. 07, output bytes
// 62 24 93 9a 79 f5 f5 93.
TEST(KeyedHash, Siphash24MatchesTheReferenceVector) {
  const SipKey key{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL};
  EXPECT_EQ(siphash24_u64(0x0706050403020100ULL, key), 0x93f5f5799a932462ULL);
}

TEST(KeyedHash, TheProcessKeyIsDrawnOnceAndUsed) {
  const SipKey& key = process_hash_key();
  EXPECT_EQ(&key, &process_hash_key());
  EXPECT_FALSE(key.k0 == 0 && key.k1 == 0);  // 2^-128 of a false failure
  EXPECT_EQ(KeyedHash64{}(12345), siphash24_u64(12345, key));
  // Another key gives other hashes: the bucket of a value cannot be known without the key.
  const SipKey other{key.k0 ^ 1, key.k1};
  EXPECT_NE(siphash24_u64(12345, other), siphash24_u64(12345, key));
}

// Multiples of one of libstdc++'s bucket counts all share bucket 0 of a table keyed by the
// plain value (std::hash<uint64_t> is the identity); keyed, they spread like random keys.
TEST(KeyedHash, MultiplesOfTheBucketCountSpreadOverTheBuckets) {
  constexpr uint64_t kBuckets = 10273;  // a libstdc++ bucket count (its prime list)
  constexpr uint64_t kKeys = 2000;
  std::unordered_set<uint64_t> plain;
  std::unordered_set<uint64_t, KeyedHash64> keyed;
  plain.rehash(kBuckets);
  keyed.rehash(kBuckets);
  ASSERT_EQ(plain.bucket_count(), kBuckets);
  ASSERT_EQ(keyed.bucket_count(), kBuckets);
  for (uint64_t i = 1; i <= kKeys; ++i) {
    plain.insert(i * kBuckets);
    keyed.insert(i * kBuckets);
  }
  ASSERT_EQ(plain.bucket_count(), kBuckets);
  ASSERT_EQ(keyed.bucket_count(), kBuckets);
  EXPECT_EQ(plain.bucket_size(0), kKeys);  // the flood the keyed hash defeats
  size_t longest = 0;
  for (size_t b = 0; b < keyed.bucket_count(); ++b) longest = std::max(longest, keyed.bucket_size(b));
  // 2,000 random keys in 10,273 buckets: the longest chain is about 5; 16 is far in the tail.
  EXPECT_LE(longest, 16u);
}

}  // namespace
}  // namespace pdr
