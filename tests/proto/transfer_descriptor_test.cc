#include "proto/transfer_descriptor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <tuple>
#include <vector>
#include <msgpack.hpp>
#include <string>
#include <utility>

#include "proto/discovery_message.h"  // as_bytes()

#include "tests/support/hex.h"
#include "tests/support/status_matchers.h"
#include "tests/support/source_path.h"

namespace pdr::proto {
namespace {

using pdr::test::from_hex;
using pdr::test::to_hex;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kMax32 = std::numeric_limits<uint32_t>::max();

// ---- Vectors: Python's msgpack.packb(..., use_bin_type=True) of the dicts that seed
// tests/fuzz/corpus/transfer_descriptor/ (full.msgpack, minimal.msgpack). ----

// {v:1, v_minor:2, agent:"prefill-0", hostname:"node-3",
//  boot_id:"6f1c2a9e-1b7d-4a53-9d1e-0c4f3b2a1d00",
//  endpoints:[["tcp","127.0.10.5:7400"],["shm","/run/pdr/prefill-0.sock"],
//             ["rdma","127.0.10.5:7401"]],
//  regions:[[0,1<<30,"dram"],[1,1<<34,"vram"]],
//  layouts:[[0,0,16384,16384,65536,1,0],[1,1,8192,8192,32768,32,1<<28]],
//  rkeys:[[1,b"\x12\x34\x56\x78\0\0\0\x01"]]}
constexpr std::string_view kFullHex =
    "89a17601a7765f6d696e6f7202a56167656e74a970726566696c6c2d30a8686f73746e616d65a66e6f64652d33a762"
    "6f6f745f6964d92436663163326139652d316237642d346135332d396431652d306334663362326131643030a9656e"
    "64706f696e74739392a3746370af3132372e302e31302e353a3734303092a373686db72f72756e2f7064722f707265"
    "66696c6c2d302e736f636b92a472646d61af3132372e302e31302e353a37343031a7726567696f6e73929300ce4000"
    "0000a46472616d9301cf0000000400000000a47672616da76c61796f75747392970000cd4000cd4000ce0001000001"
    "00970101cd2000cd2000cd800020ce10000000a5726b657973919201c4081234567800000001";
// {v:1, agent:"a", hostname:"", boot_id:"", endpoints:[], regions:[], layouts:[]}
constexpr std::string_view kMinimalHex =
    "87a17601a56167656e74a161a8686f73746e616d65a0a7626f6f745f6964a0a9656e64706f696e747390a772656769"
    "6f6e7390a76c61796f75747390";

TransferDescriptor full_descriptor() {
  TransferDescriptor d;
  d.version_minor = 2;
  d.agent = "prefill-0";
  d.hostname = "node-3";
  d.boot_id = "6f1c2a9e-1b7d-4a53-9d1e-0c4f3b2a1d00";
  d.endpoints = {{EndpointBackend::kTcp, "127.0.10.5:7400"},
                 {EndpointBackend::kShm, "/run/pdr/prefill-0.sock"},
                 {EndpointBackend::kRdma, "127.0.10.5:7401"}};
  d.regions = {{0, uint64_t{1} << 30, RegionKind::kDram},
               {1, uint64_t{1} << 34, RegionKind::kVram}};
  d.layouts = {{0, 0, 16384, 16384, 65536, 1, 0}, {1, 1, 8192, 8192, 32768, 32, uint64_t{1} << 28}};
  d.rkeys = {{1, std::string("\x12\x34\x56\x78\0\0\0\x01", 8)}};
  return d;
}

// A small valid descriptor that error tests mutate.
TransferDescriptor base() {
  TransferDescriptor d;
  d.agent = "decode-1";
  d.hostname = "node-4";
  d.boot_id = "b00t";
  d.endpoints = {{EndpointBackend::kTcp, "127.0.10.6:7400"}};
  d.regions = {{5, 4096, RegionKind::kDram}};
  d.layouts = {{9, 5, 1024, 1024, 4, 1, 0}};
  return d;
}

Status decode(std::string_view bytes, TransferDescriptor* out,
              const DescriptorLimits& limits = DescriptorLimits{}) {
  return decode_descriptor(as_bytes(bytes), limits, out);
}

using pdr::test::Fails;

// Encodes `d` (not validated) and decodes it.
::testing::AssertionResult DecodeFails(const TransferDescriptor& d, StatusCode code,
                                       std::string_view message,
                                       const DescriptorLimits& limits = DescriptorLimits{}) {
  TransferDescriptor out;
  return Fails(decode(encode_descriptor(d), &out, limits), code, message);
}

// ---- hand-built msgpack for shapes encode_descriptor() never produces ----

struct StringBuffer {
  std::string data;
  void write(const char* bytes, size_t size) { data.append(bytes, size); }
};

// The base() map with `key` replaced by (or, when absent, extended with) an arbitrary value.
template <typename Value>
std::string with_key(std::string_view key, const Value& value) {
  const std::string encoded = encode_descriptor(base());
  msgpack::object_handle handle = msgpack::unpack(encoded.data(), encoded.size());
  const msgpack::object& root = handle.get();
  bool present = false;
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const msgpack::object& name = root.via.map.ptr[i].key;
    present = present || std::string_view(name.via.str.ptr, name.via.str.size) == key;
  }
  StringBuffer buffer;
  msgpack::packer<StringBuffer> packer(buffer);
  packer.pack_map(root.via.map.size + (present ? 0 : 1));
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    const msgpack::object& name = root.via.map.ptr[i].key;
    packer.pack(name);
    if (std::string_view(name.via.str.ptr, name.via.str.size) == key) {
      packer.pack(value);
    } else {
      packer.pack(root.via.map.ptr[i].val);
    }
  }
  if (!present) {
    packer.pack(std::string(key));
    packer.pack(value);
  }
  return buffer.data;
}

std::string without_key(std::string_view key) {
  const std::string encoded = encode_descriptor(base());
  msgpack::object_handle handle = msgpack::unpack(encoded.data(), encoded.size());
  const msgpack::object& root = handle.get();
  StringBuffer buffer;
  msgpack::packer<StringBuffer> packer(buffer);
  packer.pack_map(root.via.map.size - 1);
  for (uint32_t i = 0; i < root.via.map.size; ++i) {
    std::string name(root.via.map.ptr[i].key.via.str.ptr, root.via.map.ptr[i].key.via.str.size);
    if (name == key) continue;
    packer.pack(name);
    packer.pack(root.via.map.ptr[i].val);
  }
  return buffer.data;
}

// ---- encoding and round trips ----

TEST(TransferDescriptor, EncodesLikePythonPackb) {
  EXPECT_EQ(encode_descriptor(full_descriptor()), from_hex(kFullHex));
  TransferDescriptor minimal;
  minimal.version_minor = 0;  // the vector is a v1.0 writer's
  minimal.agent = "a";
  EXPECT_EQ(encode_descriptor(minimal), from_hex(kMinimalHex));
}

TEST(TransferDescriptor, DecodesPythonVectors) {
  TransferDescriptor out;
  ASSERT_TRUE(decode(from_hex(kFullHex), &out).is_ok());
  EXPECT_EQ(out, full_descriptor());
  ASSERT_TRUE(decode(from_hex(kMinimalHex), &out).is_ok());
  TransferDescriptor minimal;
  minimal.version_minor = 0;  // absent v_minor decodes as 0
  minimal.agent = "a";
  EXPECT_EQ(out, minimal);
  EXPECT_TRUE(out.secret.empty());
}

TEST(TransferDescriptor, SecretRoundTripsAndIsOptional) {
  TransferDescriptor d = base();
  d.secret = std::string(kTransferSecretBytes, '\0');
  for (size_t i = 0; i < d.secret.size(); ++i) d.secret[i] = static_cast<char>(0xf0 - i);
  const std::string encoded = encode_descriptor(d);
  TransferDescriptor out;
  ASSERT_TRUE(decode(encoded, &out).is_ok()) << decode(encoded, &out).to_string();
  EXPECT_EQ(out, d);
  EXPECT_EQ(out.version_minor, 1u);
  // Without a secret the key is left out, so a v1.0 reader sees exactly what it used to.
  d.secret.clear();
  EXPECT_EQ(encode_descriptor(d).find("secret"), std::string::npos);
  ASSERT_TRUE(decode(encode_descriptor(d), &out).is_ok());
  EXPECT_TRUE(out.secret.empty());
  ASSERT_TRUE(decode(with_key("secret", msgpack::type::nil_t()), &out).is_ok());
  EXPECT_TRUE(out.secret.empty());
}

TEST(TransferDescriptorErrors, Secret) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(with_key("secret", std::string(32, 's')), &out), StatusCode::kWrongType,
                    "secret must be bin, got str"));
  EXPECT_TRUE(Fails(decode(with_key("secret", 7), &out), StatusCode::kWrongType,
                    "secret must be bin, got int"));
  TransferDescriptor d = base();
  d.secret = std::string(31, 's');
  EXPECT_TRUE(DecodeFails(d, StatusCode::kInvalidValue, "secret is 31 bytes, must be 32"));
  d.secret = std::string(33, 's');
  EXPECT_TRUE(DecodeFails(d, StatusCode::kInvalidValue, "secret is 33 bytes, must be 32"));
  EXPECT_TRUE(Fails(validate_descriptor(d, {}), StatusCode::kInvalidValue,
                    "secret is 33 bytes, must be 32"));
  // A huge bin is bounded by the whole-descriptor limit before it is copied.
  d.secret = std::string(20000, 's');
  EXPECT_FALSE(decode(encode_descriptor(d), &out).is_ok());
}

TEST(TransferDescriptor, RoundTripsBoundaryValues) {
  TransferDescriptor d = base();
  d.version_minor = static_cast<uint32_t>(kMax32);
  d.regions = {{static_cast<uint32_t>(kMax32), kMax64, RegionKind::kVram},
               {0, 1, RegionKind::kDram}};
  // Extent exactly kMax64: (2-1)*(kMax64/2) + (2-1)*(kMax64/2 - 1) + 2 = kMax64.
  d.layouts = {{static_cast<uint32_t>(kMax32), static_cast<uint32_t>(kMax32), 2, kMax64 / 2 - 1, 2,
                2, kMax64 / 2},
               {0, 0, 1, 0, static_cast<uint32_t>(kMax32), 1, 0}};
  d.rkeys = {{0, std::string(256, '\xff')}, {static_cast<uint32_t>(kMax32), ""}};
  ASSERT_TRUE(validate_descriptor(d, DescriptorLimits{}).is_ok())
      << validate_descriptor(d, DescriptorLimits{}).to_string();
  TransferDescriptor out;
  ASSERT_TRUE(decode(encode_descriptor(d), &out).is_ok())
      << decode(encode_descriptor(d), &out).to_string();
  EXPECT_EQ(out, d);
  EXPECT_EQ(encode_descriptor(out), encode_descriptor(d));
}

TEST(TransferDescriptor, RoundTripsAtEveryListLimit) {
  DescriptorLimits limits;
  limits.max_endpoints = 3;
  limits.max_regions = 4;
  limits.max_layouts = 5;
  TransferDescriptor d = base();
  d.endpoints.assign(3, {EndpointBackend::kShm, "/s"});
  d.regions.clear();
  for (uint32_t i = 0; i < 4; ++i) d.regions.push_back({i, 1024, RegionKind::kDram});
  d.layouts.clear();
  for (uint32_t i = 0; i < 5; ++i) d.layouts.push_back({i, i % 4, 1024, 0, 1, 1, 0});
  TransferDescriptor out;
  ASSERT_TRUE(decode(encode_descriptor(d), &out, limits).is_ok());
  EXPECT_EQ(out, d);
}

TEST(TransferDescriptor, IgnoresUnknownKeysAndTrailingItems) {
  // future_minor.msgpack: a v1.7 writer with a new top-level key and an extra item in each tuple
  // (layouts: after the optional base_offset).
  const std::string future = from_hex(
      "89a17601a7765f6d696e6f7207a56167656e74a170a8686f73746e616d65a168a7626f6f745f6964a162a76e6577"
      "5f6b657981a178920102a9656e64706f696e74739193a3746370ab3132372e312e322e343a31a56578747261a772"
      "6567696f6e7391940064a46472616d09a76c61796f757473919900000a0a0a010000a178");
  TransferDescriptor out;
  ASSERT_TRUE(decode(future, &out).is_ok()) << decode(future, &out).to_string();
  EXPECT_EQ(out.version_minor, 7u);
  EXPECT_EQ(out.agent, "p");
  ASSERT_EQ(out.endpoints.size(), 1u);
  EXPECT_EQ(out.endpoints[0].address, "127.1.2.4:1");
  ASSERT_EQ(out.regions.size(), 1u);
  EXPECT_EQ(out.regions[0].length, 100u);
  ASSERT_EQ(out.layouts.size(), 1u);
  EXPECT_EQ(out.layouts[0].block_count, 10u);
}

TEST(TransferDescriptor, NilOptionalKeysCountAsAbsent) {
  TransferDescriptor out;
  ASSERT_TRUE(decode(with_key("rkeys", msgpack::type::nil_t()), &out).is_ok());
  EXPECT_TRUE(out.rkeys.empty());
  ASSERT_TRUE(decode(with_key("v_minor", msgpack::type::nil_t()), &out).is_ok());
  EXPECT_EQ(out.version_minor, 0u);
}

TEST(TransferDescriptor, Names) {
  EXPECT_EQ(to_string(EndpointBackend::kTcp), "tcp");
  EXPECT_EQ(to_string(EndpointBackend::kShm), "shm");
  EXPECT_EQ(to_string(EndpointBackend::kRdma), "rdma");
  EXPECT_EQ(to_string(RegionKind::kDram), "dram");
  EXPECT_EQ(to_string(RegionKind::kVram), "vram");
  EndpointBackend backend{};
  EXPECT_TRUE(parse_endpoint_backend("rdma", &backend));
  EXPECT_EQ(backend, EndpointBackend::kRdma);
  EXPECT_FALSE(parse_endpoint_backend("TCP", &backend));
  RegionKind kind{};
  EXPECT_TRUE(parse_region_kind("vram", &kind));
  EXPECT_EQ(kind, RegionKind::kVram);
  EXPECT_FALSE(parse_region_kind("hbm", &kind));
}

// ---- layout_extent ----

TEST(LayoutExtent, ComputesAndRefusesOverflow) {
  uint64_t extent = 0;
  EXPECT_TRUE(layout_extent({0, 0, 1024, 1024, 4, 1, 0}, &extent));
  EXPECT_EQ(extent, 4096u);
  EXPECT_TRUE(layout_extent({0, 0, 100, 128, 3, 2, 1000}, &extent));
  EXPECT_EQ(extent, 1000u + 256u + 100u);
  EXPECT_FALSE(layout_extent({0, 0, 0, 1, 1, 1, 0}, &extent)) << "block_bytes 0";
  EXPECT_FALSE(layout_extent({0, 0, 1, 1, 0, 1, 0}, &extent)) << "block_count 0";
  EXPECT_FALSE(layout_extent({0, 0, 1, 1, 1, 0, 0}, &extent)) << "layers 0";
  EXPECT_FALSE(layout_extent({0, 0, 1, kMax64, 3, 1, 0}, &extent)) << "blocks multiply";
  EXPECT_FALSE(layout_extent({0, 0, 1, 0, 1, 3, kMax64}, &extent)) << "layers multiply";
  EXPECT_FALSE(layout_extent({0, 0, 1, kMax64 / 2 + 1, 2, 2, kMax64 / 2 + 1}, &extent)) << "sum";
  EXPECT_FALSE(layout_extent({0, 0, kMax64, 1, 2, 1, 0}, &extent)) << "+ block_bytes";
  EXPECT_TRUE(layout_extent({0, 0, kMax64, 0, 2, 1, 0}, &extent));
  EXPECT_EQ(extent, kMax64);
}

// ---- errors from the msgpack layer ----

TEST(TransferDescriptorErrors, BytesLevel) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode("", &out), StatusCode::kMalformed, "message is empty"));
  const std::string good = encode_descriptor(base());
  EXPECT_TRUE(Fails(decode(good.substr(0, good.size() - 1), &out), StatusCode::kMalformed,
                    "msgpack data is truncated"));
  EXPECT_TRUE(Fails(decode(good + '\xc0', &out), StatusCode::kMalformed,
                    "1 trailing bytes after the msgpack object"));
  EXPECT_TRUE(Fails(decode("\xc1", &out), StatusCode::kMalformed, "invalid msgpack data"));
  DescriptorLimits small;
  small.max_bytes = good.size() - 1;
  EXPECT_TRUE(Fails(decode(good, &out, small), StatusCode::kTooLarge,
                    "message is " + std::to_string(good.size()) + " bytes, limit " +
                        std::to_string(good.size() - 1)));
  EXPECT_TRUE(Fails(decode("\x93\x01\x02\x03", &out), StatusCode::kWrongType,
                    "descriptor must be a map, got array"));
  EXPECT_TRUE(Fails(decode("\x81\x01\x02", &out), StatusCode::kWrongType,
                    "descriptor keys must be strings, got int"));
  EXPECT_TRUE(Fails(decode("\x82\xa1v\x01\xa1v\x01", &out), StatusCode::kMalformed,
                    "key 'v' appears twice in descriptor"));
  // Deeper than the decoder allows, inside an unknown key.
  using Deep = std::vector<std::vector<std::vector<std::vector<int>>>>;
  EXPECT_TRUE(decode(with_key("deep", Deep{{{{1}}}}), &out).is_ok()) << "5 levels are allowed";
  EXPECT_TRUE(Fails(decode(with_key("deep", std::vector<Deep>{{{{{1}}}}}), &out),
                    StatusCode::kTooDeep, "nesting is deeper than 5 levels"));
  EXPECT_TRUE(decode(with_key("name", std::string(1000, 'x')), &out).is_ok())
      << "an unknown key's string is bounded only by the message size";
  std::map<std::string, int> many;
  for (int i = 0; i < 33; ++i) many["k" + std::to_string(i)] = i;
  EXPECT_TRUE(Fails(decode(with_key("many", many), &out), StatusCode::kTooLarge,
                    "a map has more than 32 entries"));
  EXPECT_TRUE(Fails(decode(with_key("many", std::vector<int>(66, 0)), &out), StatusCode::kTooLarge,
                    "an array has more than 65 items"));
}

// ---- version ----

TEST(TransferDescriptorErrors, Version) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(without_key("v"), &out), StatusCode::kMissingKey,
                    "v is required for a transfer descriptor"));
  EXPECT_TRUE(Fails(decode(with_key("v", 0), &out), StatusCode::kOutOfRange,
                    "v 0 is out of range 1..4294967295"));
  EXPECT_TRUE(Fails(decode(with_key("v", -1), &out), StatusCode::kOutOfRange,
                    "v -1 is out of range 1..4294967295"));
  EXPECT_TRUE(Fails(decode(with_key("v", kMax32 + 1), &out), StatusCode::kOutOfRange,
                    "v 4294967296 is out of range 1..4294967295"));
  EXPECT_TRUE(Fails(decode(with_key("v", "1"), &out), StatusCode::kWrongType,
                    "v must be an integer, got str"));
  // A newer major is refused before anything else is read, whatever the rest looks like.
  EXPECT_TRUE(Fails(decode("\x82\xa1v\x02\xa5""agent\x07", &out), StatusCode::kRejected,
                    "descriptor major version 2 is newer than supported 1"));
  EXPECT_TRUE(Fails(decode(with_key("v_minor", -3), &out), StatusCode::kOutOfRange,
                    "v_minor -3 is out of range 0..4294967295"));
  TransferDescriptor d = base();
  d.version_major = 0;
  EXPECT_TRUE(Fails(validate_descriptor(d, {}), StatusCode::kOutOfRange,
                    "v 0 is out of range 1..4294967295"));
  d.version_major = 3;
  EXPECT_TRUE(Fails(validate_descriptor(d, {}), StatusCode::kRejected,
                    "descriptor major version 3 is newer than supported 1"));
}

// ---- top-level strings ----

TEST(TransferDescriptorErrors, Strings) {
  TransferDescriptor out;
  for (const char* key : {"agent", "hostname", "boot_id"}) {
    EXPECT_TRUE(Fails(decode(without_key(key), &out), StatusCode::kMissingKey,
                      std::string(key) + " is required for a transfer descriptor"));
    EXPECT_TRUE(Fails(decode(with_key(key, 5), &out), StatusCode::kWrongType,
                      std::string(key) + " must be a string, got int"));
  }
  TransferDescriptor d = base();
  d.agent = "";
  EXPECT_TRUE(DecodeFails(d, StatusCode::kInvalidValue, "agent must not be empty"));
  d.agent = std::string(256, 'a');
  TransferDescriptor roundtrip;
  ASSERT_TRUE(decode(encode_descriptor(d), &roundtrip).is_ok()) << "256 bytes is the limit";
  d.agent = std::string(100, 'a');
  DescriptorLimits limits;
  limits.max_string_bytes = 99;
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "agent is 100 bytes, limit 99", limits));
  EXPECT_TRUE(Fails(validate_descriptor(d, limits), StatusCode::kTooLarge,
                    "agent is 100 bytes, limit 99"));
  d = base();
  d.hostname = std::string(100, 'h');
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "hostname is 100 bytes, limit 99", limits));
  d = base();
  d.boot_id = std::string(100, 'b');
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "boot_id is 100 bytes, limit 99", limits));
  d = base();
  d.hostname.clear();
  d.boot_id.clear();
  EXPECT_TRUE(validate_descriptor(d, {}).is_ok()) << "empty host identity is allowed";
}

// ---- endpoints ----

TEST(TransferDescriptorErrors, Endpoints) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(without_key("endpoints"), &out), StatusCode::kMissingKey,
                    "endpoints is required for a transfer descriptor"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", 1), &out), StatusCode::kWrongType,
                    "endpoints must be an array, got int"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", std::vector<int>{1}), &out),
                    StatusCode::kWrongType, "endpoints[0] must be an array, got int"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", std::vector<std::vector<std::string>>{{"tcp"}}),
                           &out),
                    StatusCode::kMalformed, "endpoints[0] has 1 items, expected at least 2"));
  using Pair = std::tuple<int, std::string>;
  EXPECT_TRUE(Fails(decode(with_key("endpoints", std::vector<Pair>{{1, "x"}}), &out),
                    StatusCode::kWrongType, "endpoints[0].backend must be a string, got int"));
  using Strings = std::vector<std::vector<std::string>>;
  EXPECT_TRUE(Fails(decode(with_key("endpoints", Strings{{"tcp", "a:1"}, {"udp", "a:2"}}), &out),
                    StatusCode::kInvalidValue,
                    "endpoints[1].backend 'udp' is not tcp, shm or rdma"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", Strings{{"TCP", "a:1"}}), &out),
                    StatusCode::kInvalidValue,
                    "endpoints[0].backend 'TCP' is not tcp, shm or rdma"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", std::vector<std::tuple<std::string, int>>{
                                                     {"tcp", 7}}),
                           &out),
                    StatusCode::kWrongType, "endpoints[0].address must be a string, got int"));
  EXPECT_TRUE(Fails(decode(with_key("endpoints", Strings{{"tcp", ""}}), &out),
                    StatusCode::kInvalidValue, "endpoints[0].address must not be empty"));
  DescriptorLimits limits;
  limits.max_string_bytes = 8;
  EXPECT_TRUE(Fails(decode(with_key("endpoints", Strings{{"tcp", "127.0.10.1:80"}}), &out, limits),
                    StatusCode::kTooLarge, "endpoints[0].address is 13 bytes, limit 8"));
  TransferDescriptor d = base();
  d.endpoints.assign(17, {EndpointBackend::kTcp, "a:1"});
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "endpoints has 17 items, limit 16"));
  EXPECT_TRUE(Fails(validate_descriptor(d, {}), StatusCode::kTooLarge,
                    "endpoints has 17 items, limit 16"));
  d.endpoints.assign(200, {EndpointBackend::kTcp, "a:1"});
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "an array has more than 65 items"));
  d.endpoints.clear();
  EXPECT_TRUE(validate_descriptor(d, {}).is_ok()) << "no endpoints is allowed";
}

// ---- regions ----

TEST(TransferDescriptorErrors, Regions) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(without_key("regions"), &out), StatusCode::kMissingKey,
                    "regions is required for a transfer descriptor"));
  EXPECT_TRUE(Fails(decode(with_key("regions", "x"), &out), StatusCode::kWrongType,
                    "regions must be an array, got str"));
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<std::vector<int>>{{1, 2}}), &out),
                    StatusCode::kMalformed, "regions[0] has 2 items, expected at least 3"));
  using Region = std::tuple<int64_t, int64_t, std::string>;
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<Region>{{-1, 1, "dram"}}), &out),
                    StatusCode::kOutOfRange, "regions[0].id -1 is out of range 0..4294967295"));
  using BigRegion = std::tuple<uint64_t, uint64_t, std::string>;
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<BigRegion>{{kMax32 + 1, 1, "dram"}}),
                           &out),
                    StatusCode::kOutOfRange,
                    "regions[0].id 4294967296 is out of range 0..4294967295"));
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<Region>{{5, -4096, "dram"}}), &out),
                    StatusCode::kOutOfRange,
                    "regions[0].length -4096 is out of range 0..18446744073709551615"));
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<std::tuple<int, double, std::string>>{
                                                   {5, 1.5, "dram"}}),
                           &out),
                    StatusCode::kWrongType, "regions[0].length must be an integer, got float"));
  EXPECT_TRUE(Fails(decode(with_key("regions", std::vector<Region>{{5, 4096, "hbm"}}), &out),
                    StatusCode::kInvalidValue, "regions[0].kind 'hbm' is not dram or vram"));
  EXPECT_TRUE(
      Fails(decode(with_key("regions", std::vector<std::tuple<int, int, int>>{{5, 4096, 0}}), &out),
            StatusCode::kWrongType, "regions[0].kind must be a string, got int"));
  TransferDescriptor d = base();
  d.regions = {{5, 4096, RegionKind::kDram}, {6, 1, RegionKind::kDram}, {5, 8, RegionKind::kVram}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kMalformed, "regions[2].id 5 is not unique"));
  d = base();
  d.layouts.clear();
  d.regions.clear();
  for (uint32_t i = 0; i < 65; ++i) d.regions.push_back({i, 1, RegionKind::kDram});
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "regions has 65 items, limit 64"));
}

// ---- layouts ----

TEST(TransferDescriptorErrors, LayoutShapes) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(without_key("layouts"), &out), StatusCode::kMissingKey,
                    "layouts is required for a transfer descriptor"));
  EXPECT_TRUE(Fails(decode(with_key("layouts", std::map<std::string, int>{{"a", 1}}), &out),
                    StatusCode::kWrongType, "layouts must be an array, got map"));
  EXPECT_TRUE(Fails(decode(with_key("layouts", std::vector<std::vector<int>>{{9, 5, 1, 1, 1, 1}}),
                           &out),
                    StatusCode::kMalformed, "layouts[0] has 6 items, expected at least 7"));
  const char* names[] = {"id",          "region_id", "block_bytes", "stride",
                         "block_count", "layers",    "layer_stride"};
  const bool is_u32[] = {true, true, false, false, true, true, false};
  for (size_t field = 0; field < 7; ++field) {
    std::vector<int64_t> item{9, 5, 1024, 1024, 4, 1, 0};
    item[field] = -1;
    const std::string hi = is_u32[field] ? "4294967295" : "18446744073709551615";
    EXPECT_TRUE(Fails(decode(with_key("layouts", std::vector<std::vector<int64_t>>{item}), &out),
                      StatusCode::kOutOfRange,
                      std::string("layouts[0].") + names[field] + " -1 is out of range 0.." + hi));
    if (is_u32[field]) {
      std::vector<uint64_t> big{9, 5, 1024, 1024, 4, 1, 0};
      big[field] = kMax32 + 1;
      EXPECT_TRUE(Fails(decode(with_key("layouts", std::vector<std::vector<uint64_t>>{big}), &out),
                        StatusCode::kOutOfRange,
                        std::string("layouts[0].") + names[field] +
                            " 4294967296 is out of range 0..4294967295"));
    }
  }
  TransferDescriptor d = base();
  d.layouts.assign(65, {0, 5, 1, 1, 1, 1, 0});
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "layouts has 65 items, limit 64"));
  d.layouts = {{9, 5, 1024, 1024, 4, 1, 0}, {9, 5, 1, 1, 1, 1, 0}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kMalformed, "layouts[1].id 9 is not unique"));
}

TEST(TransferDescriptorErrors, LayoutGeometry) {
  TransferDescriptor d = base();  // region 5: 4096 bytes
  d.layouts = {{9, 6, 1024, 1024, 4, 1, 0}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kMalformed, "layouts[0].region_id 6 names no region"));
  d.layouts = {{9, 5, 0, 1024, 4, 1, 0}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kInvalidValue, "layouts[0] block_bytes must be at least 1"));
  d.layouts = {{9, 5, 1024, 1024, 0, 1, 0}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kInvalidValue, "layouts[0] block_count must be at least 1"));
  d.layouts = {{9, 5, 1024, 1024, 4, 0, 0}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kInvalidValue, "layouts[0] layers must be at least 1"));
  // Exactly fits, then one byte over through each term.
  d.layouts = {{9, 5, 1024, 1024, 4, 1, 0}};
  EXPECT_TRUE(validate_descriptor(d, {}).is_ok());
  d.layouts = {{9, 5, 1025, 1024, 4, 1, 0}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4097 bytes, region 5 has 4096"));
  d.layouts = {{9, 5, 1024, 1025, 4, 1, 0}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4099 bytes, region 5 has 4096"));
  d.layouts = {{9, 5, 1024, 1024, 5, 1, 0}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 5120 bytes, region 5 has 4096"));
  // Two layers of 2048: fits; layers * layer_stride is checked as well as the last block's end.
  d.layouts = {{9, 5, 512, 512, 4, 2, 2048}};
  EXPECT_TRUE(validate_descriptor(d, {}).is_ok());
  d.layouts = {{9, 5, 512, 512, 4, 2, 2049}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4098 bytes, region 5 has 4096"));
  d.layouts = {{9, 5, 513, 512, 4, 2, 2048}};  // 2 * 2048 fits, the last block ends at 4097
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4097 bytes, region 5 has 4096"));
  d.layouts = {{9, 5, 16, 16, 1, 2, 2049}};  // last block ends at 2065, but 2 * 2049 = 4098
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4098 bytes, region 5 has 4096"));
  // 64-bit overflow in each product and sum, against the largest possible region.
  d.regions = {{5, kMax64, RegionKind::kDram}};
  for (const DescriptorLayout& layout :
       {DescriptorLayout{9, 5, 1, kMax64, 3, 1, 0}, DescriptorLayout{9, 5, 1, 0, 1, 3, kMax64},
        DescriptorLayout{9, 5, 1, kMax64 / 2 + 1, 2, 2, kMax64 / 2 + 1},
        DescriptorLayout{9, 5, kMax64, 1, 2, 1, 0},
        DescriptorLayout{9, 5, 1, 0, 1, static_cast<uint32_t>(kMax32), kMax64 / 4}}) {
    d.layouts = {layout};
    EXPECT_TRUE(DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] extent overflows 64 bits"));
  }
  d.layouts = {{9, 5, kMax64, 0, static_cast<uint32_t>(kMax32), 1, 0}};
  EXPECT_TRUE(validate_descriptor(d, {}).is_ok()) << "stride 0: blocks alias, extent = block_bytes";
}

TEST(TransferDescriptorErrors, LayoutBaseOffset) {
  TransferDescriptor d = base();  // region 5: 4096 bytes
  // Round trip with a base offset (an 8th item), and without one (7 items, as v1.0 writers do).
  d.layouts = {{9, 5, 1024, 1024, 2, 1, 0, 2048}};
  ASSERT_TRUE(validate_descriptor(d, {}).is_ok());
  TransferDescriptor out;
  ASSERT_TRUE(decode(encode_descriptor(d), &out).is_ok());
  EXPECT_EQ(out, d);
  TransferDescriptor no_base = d;
  no_base.layouts[0].base_offset = 0;
  EXPECT_LT(encode_descriptor(no_base).size(), encode_descriptor(d).size());
  // The base offset counts towards the extent, and its sum cannot overflow.
  d.layouts = {{9, 5, 1024, 1024, 2, 1, 0, 2049}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] needs 4097 bytes, region 5 has 4096"));
  d.regions = {{5, kMax64, RegionKind::kDram}};
  d.layouts = {{9, 5, 2, 0, 1, 1, 0, kMax64 - 1}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kOutOfRange, "layouts[0] extent overflows 64 bits"));
}

// ---- rkeys ----

TEST(TransferDescriptorErrors, Rkeys) {
  TransferDescriptor out;
  EXPECT_TRUE(Fails(decode(with_key("rkeys", 3), &out), StatusCode::kWrongType,
                    "rkeys must be an array, got int"));
  EXPECT_TRUE(Fails(decode(with_key("rkeys", std::vector<std::vector<int>>{{5}}), &out),
                    StatusCode::kMalformed, "rkeys[0] has 1 items, expected at least 2"));
  EXPECT_TRUE(Fails(decode(with_key("rkeys", std::vector<std::tuple<int, std::string>>{{5, "k"}}),
                           &out),
                    StatusCode::kWrongType, "rkeys[0].keys must be bin, got str"));
  EXPECT_TRUE(Fails(decode(with_key("rkeys", std::vector<std::vector<int>>{{-5, 0}}), &out),
                    StatusCode::kOutOfRange,
                    "rkeys[0].region_id -5 is out of range 0..4294967295"));
  TransferDescriptor d = base();
  d.rkeys = {{6, "k"}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kMalformed, "rkeys[0].region_id 6 names no region"));
  d.rkeys = {{5, "a"}, {5, "b"}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kMalformed, "rkeys[1].region_id 5 is not unique"));
  d.rkeys = {{5, std::string(257, 'k')}};
  EXPECT_TRUE(DecodeFails(d, StatusCode::kTooLarge, "rkeys[0].keys is 257 bytes, limit 256"));
  EXPECT_TRUE(Fails(validate_descriptor(d, {}), StatusCode::kTooLarge,
                    "rkeys[0].keys is 257 bytes, limit 256"));
  DescriptorLimits no_rkeys;
  no_rkeys.max_rkey_bytes = 0;
  d.rkeys = {{5, "k"}};
  EXPECT_TRUE(
      DecodeFails(d, StatusCode::kTooLarge, "rkeys[0].keys is 1 bytes, limit 0", no_rkeys));
  d.agent = "x";
  EXPECT_TRUE(Fails(decode(with_key("agent", std::vector<char>{'a'}), &out), StatusCode::kWrongType,
                    "agent must be a string, got bin"));
}

TEST(TransferDescriptorErrors, FirstErrorWins) {
  // Validation runs in documented order: strings, list sizes, endpoints, region ids, layouts.
  TransferDescriptor d = base();
  d.agent.clear();
  d.regions.push_back(d.regions[0]);
  EXPECT_EQ(validate_descriptor(d, {}).message(), "agent must not be empty");
  d.agent = "x";
  d.layouts[0].region_id = 99;
  EXPECT_EQ(validate_descriptor(d, {}).message(), "regions[1].id 5 is not unique");
}

// The fuzzer's seeds (tests/fuzz/corpus/transfer_descriptor/) are the vectors above and decode.
TEST(TransferDescriptor, SeedCorpusIsTheVectorsAndDecodes) {
  const std::string dir = pdr::test::source_path("tests/fuzz/corpus/transfer_descriptor/");
  auto read = [&](const char* name) {
    std::ifstream f(dir + name + ".msgpack", std::ios::binary);
    EXPECT_TRUE(f) << name;
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  EXPECT_EQ(read("full"), from_hex(kFullHex));
  EXPECT_EQ(read("minimal"), from_hex(kMinimalHex));
  for (const char* name : {"full", "minimal", "future_minor", "tcp_only", "with_secret"}) {
    TransferDescriptor out;
    const Status s = decode(read(name), &out);
    EXPECT_TRUE(s.is_ok()) << name << ": " << s.to_string();
  }
}

}  // namespace
}  // namespace pdr::proto
