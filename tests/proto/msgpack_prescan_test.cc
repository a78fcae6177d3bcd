// The pass over raw msgpack bytes that refuses containers declaring more elements than the bytes
// left could hold, before msgpack-cxx allocates their slots (proto/msgpack_prescan.h).
#include "proto/msgpack_prescan.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <span>
#include <string>

#include "proto/discovery_message.h"
#include "proto/kv_events.h"
#include "tests/support/hex.h"
#include "tests/support/time_scale.h"

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's allocation hooks (declared in clang's sanitizer/allocator_interface.h,
// which GCC 12 does not ship; libasan exports them all the same).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, size_t),
                                                        void (*free_hook)(const volatile void*));
#define PDR_COUNTS_ALLOCATIONS 1
#endif

namespace pdr::proto {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

Status prescan(const std::string& s, const DecodeLimits& limits = {}) {
  return check_declared_counts(bytes_of(s), limits);
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// array32 declaring 1,048,576 items, eight deep, then five bytes: 45 bytes in all. msgpack-cxx
// would allocate 24 MiB of slots at each header before finding the data missing.
std::string nested_array32_payload() { return repeat(test::from_hex("dd00100000"), 8) + test::from_hex("0101010101"); }

#ifdef PDR_COUNTS_ALLOCATIONS
std::atomic<size_t> g_largest{0}, g_total{0};
std::atomic<bool> g_counting{false};
void on_malloc(const volatile void*, size_t size) {
  if (!g_counting.load(std::memory_order_relaxed)) return;
  g_total += size;
  size_t seen = g_largest.load();
  while (size > seen && !g_largest.compare_exchange_weak(seen, size)) {
  }
}
void on_free(const volatile void*) {}
#endif

TEST(MsgpackPrescan, NestedHugeArrayHeadersAreRefusedBeforeMsgpackAllocates) {
  const std::string payload = nested_array32_payload();
  ASSERT_EQ(payload.size(), 45u);
  KvEventLimits limits;  // the subscriber's defaults: 1,048,576 tokens per event are allowed
#ifdef PDR_COUNTS_ALLOCATIONS
  static const bool installed = __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free) != 0;
  ASSERT_TRUE(installed);
  g_largest = 0;
  g_total = 0;
  g_counting = true;
#endif
  const auto start = std::chrono::steady_clock::now();
  KvEventBatch batch;
  const Status s = decode_kv_event_batch(bytes_of(payload), limits, &batch);
  const auto took = std::chrono::steady_clock::now() - start;
#ifdef PDR_COUNTS_ALLOCATIONS
  g_counting = false;
  // Without the pass: a 25,165,824-byte allocation at the first header, 8 of them in all.
  EXPECT_LT(g_largest.load(), 4096u);
  EXPECT_LT(g_total.load(), 16384u);
#endif
  EXPECT_EQ(s.code(), StatusCode::kMalformed) << s.to_string();
  EXPECT_NE(s.message().find("msgpack data is truncated: the array at byte 0 declares 1048576 items"),
            std::string::npos)
      << s.to_string();
  EXPECT_LT(took, test::scaled(std::chrono::milliseconds(50)));
  EXPECT_TRUE(batch.events.empty());
}

TEST(MsgpackPrescan, ExactlyEnoughBytesPassOneTooFewFail) {
  // array16 of 100: 100 one-byte elements fit, 99 do not.
  EXPECT_TRUE(prescan(test::from_hex("dc0064") + std::string(100, '\x01'), DecodeLimits{.max_array_items = 100}));
  const Status s = prescan(test::from_hex("dc0064") + std::string(99, '\x01'), DecodeLimits{.max_array_items = 100});
  EXPECT_EQ(s.code(), StatusCode::kMalformed);
  EXPECT_NE(s.message().find("the array at byte 0 declares 100 items, leaving 100 elements to come in 99 bytes"),
            std::string::npos)
      << s.to_string();
  // A map's entries are two elements each.
  EXPECT_TRUE(prescan(test::from_hex("83") + std::string(6, '\x01')));
  const Status m = prescan(test::from_hex("83") + std::string(5, '\x01'));
  EXPECT_NE(m.message().find("the map at byte 0 declares 3 entries, leaving 6 elements to come in 5 bytes"),
            std::string::npos)
      << m.to_string();
}

// What counts is every open container's remaining elements together: each header alone fits in
// the bytes after it, but the outer array's last two elements and the inner's three cannot share
// four bytes.
TEST(MsgpackPrescan, OpenContainersAreCountedTogether) {
  const Status s = prescan(test::from_hex("9393") + test::from_hex("01010101"));
  EXPECT_EQ(s.code(), StatusCode::kMalformed);
  EXPECT_NE(s.message().find("the array at byte 1 declares 3 items, leaving 5 elements to come in 4 bytes"),
            std::string::npos)
      << s.to_string();
  EXPECT_TRUE(prescan(test::from_hex("9393") + test::from_hex("0101010101")));
}

// Well-formed documents of every type pass (str, bin and ext lengths are skipped correctly, so
// nothing inside them is read as a header).
TEST(MsgpackPrescan, EveryTypeIsSkippedByItsLength) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_map(3);
  p.pack("ints").pack_array(8);
  p.pack_uint8(200).pack_uint16(60000).pack_uint32(4000000000u).pack_uint64(1ull << 60);
  p.pack_int8(-100).pack_int16(-30000).pack_int32(-2000000000).pack_int64(-(1ll << 60));
  p.pack("strs").pack_array(7);
  p.pack(std::string(31, '\xdd')).pack(std::string(200, '\xdd')).pack(std::string(70000, '\xdd'));
  const std::string bin(300, '\xdf');
  p.pack_bin(static_cast<uint32_t>(bin.size())).pack_bin_body(bin.data(), static_cast<uint32_t>(bin.size()));
  p.pack_ext(16, 1).pack_ext_body(bin.data(), 16);
  p.pack_ext(300, 2).pack_ext_body(bin.data(), 300);
  p.pack_array(0);
  p.pack("more").pack_array(5);
  p.pack_nil().pack_true().pack_false().pack_float(1.5f).pack_double(2.5);
  const std::string doc(buf.data(), buf.size());
  DecodeLimits generous{.max_message_bytes = 1 << 20, .max_depth = 4, .max_array_items = 64,
                        .max_map_entries = 64, .max_string_bytes = 100000, .max_bin_bytes = 1000};
  EXPECT_TRUE(prescan(doc, generous));
  // Cut short, it is refused as truncated or left to msgpack (which reports the cut), never
  // refused for anything else.
  for (size_t cut = 1; cut < doc.size(); cut += 97) {
    const Status s = prescan(doc.substr(0, cut), generous);
    if (!s) {
      EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.to_string();
    }
  }
}

// Where msgpack has an error of its own to report first, the pass steps aside so the message
// stays msgpack's: counts over the limit, nesting too deep, the reserved byte, a string running
// past the end.
TEST(MsgpackPrescan, MsgpacksOwnErrorsComeFirst) {
  EXPECT_TRUE(prescan(test::from_hex("ddffffffff")));                         // over max_array_items
  EXPECT_TRUE(prescan(test::from_hex("dfffffffff")));                         // over max_map_entries
  EXPECT_TRUE(prescan(test::from_hex("9191919191") + test::from_hex("ddffff")));  // deeper than 4
  EXPECT_TRUE(prescan(test::from_hex("92c101")));                             // reserved byte
  EXPECT_TRUE(prescan(test::from_hex("92dbffffffff41")));                     // str past the end
  // And through the decoder, msgpack's messages are unchanged.
  DiscoveryMessage out;
  Status s = decode_discovery_message(bytes_of(test::from_hex("ddffffffff")), DecodeLimits{}, &out);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.to_string();
  EXPECT_NE(s.message().find("an array has more than 64 items"), std::string::npos) << s.to_string();
  // A count within the limits that the bytes cannot hold is refused by the pass.
  s = decode_discovery_message(bytes_of(test::from_hex("dc0040")), DecodeLimits{}, &out);
  EXPECT_EQ(s.code(), StatusCode::kMalformed) << s.to_string();
  EXPECT_NE(s.message().find("declares 64 items"), std::string::npos) << s.to_string();
}

}  // namespace
}  // namespace pdr::proto
