// GID ranking (transfer/rdma/gid_rank.h): pure logic, no device.
#include "transfer/rdma/gid_rank.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdr::transfer::rdma {
namespace {

std::array<std::uint8_t, 16> ipv4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  std::array<std::uint8_t, 16> gid{};
  gid[10] = 0xff;
  gid[11] = 0xff;
  gid[12] = a;
  gid[13] = b;
  gid[14] = c;
  gid[15] = d;
  return gid;
}

std::array<std::uint8_t, 16> ipv6(std::uint8_t first, std::uint8_t second) {
  std::array<std::uint8_t, 16> gid{};
  gid[0] = first;
  gid[1] = second;
  gid[15] = 1;
  return gid;
}

GidCandidate make(int index, std::array<std::uint8_t, 16> gid, GidType type,
                  std::string netdev = "eth0", bool up = true) {
  return GidCandidate{index, gid, type, std::move(netdev), up};
}

TEST(RdmaGidRank, PrefersRoceV2Ipv4OverEverythingElse) {
  const std::vector<GidCandidate> c = {
      make(0, ipv6(0xfe, 0x80), GidType::kRoceV2),
      make(1, ipv4(127, 0, 10, 1), GidType::kRoceV1),
      make(2, ipv6(0xfd, 0x00), GidType::kRoceV2),
      make(3, ipv4(127, 0, 10, 1), GidType::kRoceV2),
  };
  EXPECT_EQ(choose_gid(c), 3);
}

TEST(RdmaGidRank, GlobalIpv6V2BeatsV1AndLinkLocal) {
  const std::vector<GidCandidate> c = {
      make(0, ipv6(0xfe, 0x80), GidType::kRoceV2),
      make(1, ipv4(127, 0, 10, 1), GidType::kRoceV1),
      make(2, ipv6(0x20, 0x01), GidType::kRoceV2),
  };
  EXPECT_EQ(choose_gid(c), 2);
}

TEST(RdmaGidRank, LinkLocalIpv4AndFe80AreLastResort) {
  const std::vector<GidCandidate> c = {
      make(0, ipv6(0xfe, 0x80), GidType::kRoceV2),
      make(1, ipv4(169, 254, 3, 4), GidType::kRoceV2),
  };
  EXPECT_EQ(choose_gid(c), 0);  // same class: lowest index
  EXPECT_EQ(gid_rank(c[0]), gid_rank(c[1]));
  const std::vector<GidCandidate> with_v1 = {c[0], make(5, ipv4(127, 0, 11, 1), GidType::kRoceV1)};
  EXPECT_EQ(choose_gid(with_v1), 5);
}

TEST(RdmaGidRank, OverlayNetdevsAreDemotedWithinTheirClass) {
  const std::vector<GidCandidate> c = {
      make(0, ipv4(127, 0, 17, 1), GidType::kRoceV2, "docker0"),
      make(1, ipv4(127, 0, 10, 1), GidType::kRoceV2, "ens1f0"),
      make(2, ipv4(127, 0, 10, 2), GidType::kRoceV2, "veth12"),
  };
  EXPECT_EQ(choose_gid(c), 1);
  // An overlay entry still beats a worse class.
  const std::vector<GidCandidate> d = {make(0, ipv6(0x20, 0x01), GidType::kRoceV2, "ens1"),
                                       make(1, ipv4(127, 0, 10, 1), GidType::kRoceV2, "cni0")};
  EXPECT_EQ(choose_gid(d), 1);
}

TEST(RdmaGidRank, UnusableEntriesAreNeverChosen) {
  const std::vector<GidCandidate> c = {
      make(0, {}, GidType::kRoceV2),                                   // zero
      make(1, ipv4(127, 0, 10, 1), GidType::kRoceV2, "eth0", false),     // netdev down
      make(2, ipv6(0xfe, 0x80), GidType::kIb),                         // IB type
  };
  EXPECT_EQ(choose_gid(c), std::nullopt);
  EXPECT_EQ(gid_rank(c[0]), std::nullopt);
  EXPECT_EQ(choose_gid(std::vector<GidCandidate>{}), std::nullopt);
}

TEST(RdmaGidRank, OverrideByIndexOrNetdev) {
  const std::vector<GidCandidate> c = {
      make(0, ipv6(0xfe, 0x80), GidType::kRoceV2, "eth1"),
      make(1, ipv4(127, 0, 10, 1), GidType::kRoceV2, "eth0"),
      make(2, ipv6(0x20, 0x01), GidType::kRoceV2, "eth1"),
      make(3, {}, GidType::kRoceV2, "eth2"),
  };
  EXPECT_EQ(choose_gid(c, GidOverride{0, ""}), 0);
  EXPECT_EQ(choose_gid(c, GidOverride{std::nullopt, "eth1"}), 2);  // best on that netdev
  // An override naming nothing usable falls back to the ranking.
  EXPECT_EQ(choose_gid(c, GidOverride{3, ""}), 1);
  EXPECT_EQ(choose_gid(c, GidOverride{9, "eth9"}), 1);
}

TEST(RdmaGidRank, UnknownTypeRanksLikeV1) {
  const std::vector<GidCandidate> c = {make(0, ipv4(127, 0, 10, 1), GidType::kUnknown),
                                       make(1, ipv6(0x20, 0x01), GidType::kRoceV2)};
  EXPECT_EQ(choose_gid(c), 1);
}

}  // namespace
}  // namespace pdr::transfer::rdma
