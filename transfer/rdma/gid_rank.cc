// GID ranking (contract: gid_rank.h).
#include "transfer/rdma/gid_rank.h"

#include <algorithm>
#include <array>
#include <string_view>

namespace pdr::transfer::rdma {

namespace {

bool is_zero(const std::array<std::uint8_t, 16>& gid) {
  return std::all_of(gid.begin(), gid.end(), [](std::uint8_t b) { return b == 0; });
}

bool is_ipv4_mapped(const std::array<std::uint8_t, 16>& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return false;
  }
  return gid[10] == 0xff && gid[11] == 0xff;
}

bool is_link_local(const std::array<std::uint8_t, 16>& gid) {
  if (is_ipv4_mapped(gid)) return gid[12] == 169 && gid[13] == 254;
  return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
}

// Container and overlay interfaces: their addresses are rarely reachable from another host.
bool is_overlay_netdev(std::string_view netdev) {
  static constexpr std::array<std::string_view, 7> kPrefixes = {
      "docker", "cni", "veth", "virbr", "flannel", "cali", "br-"};
  return std::any_of(kPrefixes.begin(), kPrefixes.end(),
                     [&](std::string_view prefix) { return netdev.starts_with(prefix); });
}

bool usable(const GidCandidate& c) {
  return !is_zero(c.gid) && c.netdev_up && c.type != GidType::kIb;
}

}  // namespace

std::optional<int> gid_rank(const GidCandidate& c) {
  if (!usable(c)) return std::nullopt;
  int klass;
  if (is_link_local(c.gid)) {
    klass = 6;
  } else {
    const bool v2 = c.type == GidType::kRoceV2;
    const bool v4 = is_ipv4_mapped(c.gid);
    klass = v2 ? (v4 ? 0 : 2) : (v4 ? 4 : 5);
  }
  return klass * 2 + (is_overlay_netdev(c.netdev) ? 1 : 0);
}

std::optional<int> choose_gid(std::span<const GidCandidate> candidates,
                              const GidOverride& override_choice) {
  for (const GidCandidate& c : candidates) {
    if (!usable(c)) continue;
    if (override_choice.index && *override_choice.index == c.index) return c.index;
  }
  if (!override_choice.netdev.empty()) {
    const GidCandidate* best = nullptr;
    for (const GidCandidate& c : candidates) {
      if (!usable(c) || c.netdev != override_choice.netdev) continue;
      if (best == nullptr || *gid_rank(c) < *gid_rank(*best)) best = &c;
    }
    if (best != nullptr) return best->index;
  }
  const GidCandidate* best = nullptr;
  std::optional<int> best_rank;
  for (const GidCandidate& c : candidates) {
    const auto rank = gid_rank(c);
    if (!rank) continue;
    if (best == nullptr || *rank < *best_rank || (*rank == *best_rank && c.index < best->index)) {
      best = &c;
      best_rank = rank;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->index;
}

}  // namespace pdr::transfer::rdma
