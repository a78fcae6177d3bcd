// RoCE v2 GID selection as a pure function over a candidate list (docs/design/kv-transfer.md R-5, after Mooncake's
// rdma_gid_probe.h). The backend fills the list from ibv_query_gid_ex (type, netdev) and picks.
//
// Ranking, best first (ties: lowest index):
//   1. RoCE v2, IPv4-mapped (::ffff:a.b.c.d), not 169.254/16 link-local
//   2. RoCE v2, global or ULA IPv6 (not fe80::/10)
//   3. RoCE v1 or unknown type entries of the same two kinds
//   4. link-local entries (fe80::/10, 169.254/16)
// Within a class an entry on a docker/cni/veth/virbr/flannel/cali netdev ranks below any other
// entry of that class. Never chosen: all-zero GIDs, entries whose netdev is down, IB-type entries
// (they carry no L3 address). An override (an index, or a netdev name) wins when it names a usable
// candidate.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace pdr::transfer::rdma {

enum class GidType : std::uint8_t { kUnknown = 0, kIb, kRoceV1, kRoceV2 };

struct GidCandidate {
  int index = 0;
  std::array<std::uint8_t, 16> gid{};
  GidType type = GidType::kUnknown;
  std::string netdev;   // empty: unknown
  bool netdev_up = true;
};

struct GidOverride {
  std::optional<int> index;
  std::string netdev;  // empty: none
};

// Returns the chosen candidate's index field, or nullopt when none is usable.
std::optional<int> choose_gid(std::span<const GidCandidate> candidates,
                              const GidOverride& override_choice = {});

// Lower is better; nullopt when unusable. Exposed for tests and logs.
std::optional<int> gid_rank(const GidCandidate& candidate);

}  // namespace pdr::transfer::rdma
