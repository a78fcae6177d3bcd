// The value each replica publishes for one of its registry entries under
// <prefix>nodes/<replica id>/<node key> (registry.backend: etcd; discovery/sources/etcd/registry_replicator.h):
// the entry as a pdrouter registration (discovery_message.h, msgpack) plus one key of its own,
//   "pdr_admission": how the node proved who it is on the replica that owns the entry: "open",
//   "address", "token", "curve" (its admission class there, discovery/config/admission.h) or "operator"
//   (a static or admin entry there).
// The other replicas apply the weaker-sender rule to the entry with it (discovery/registry.h
// upsert_replica). Replicas that predate the key ignore it (the discovery decoder skips unknown
// keys), and a value without it (written by such a replica) decodes with an empty admission,
// which readers take as the weakest class: trust is never inferred from what a value leaves out.
// Pure: no I/O. Values come from etcd (untrusted): the decoder bounds what it accepts.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "proto/discovery_message.h"

namespace pdr::proto {

inline constexpr std::string_view kRegistryEntryAdmissionKey = "pdr_admission";
inline constexpr size_t kMaxRegistryEntryAdmissionBytes = 32;

struct EtcdRegistryEntry {
  Registration registration;
  std::string admission;  // as written; "" when the value has none
};

// `admission` is written as given ("" leaves the key out).
std::string encode_etcd_registry_entry(const Registration& registration, std::string_view admission);
// decode_discovery_message's errors (a value that is not a registration: kUnknownType), and
// kWrongType / kTooLarge for a pdr_admission that is not a string of at most
// kMaxRegistryEntryAdmissionBytes. `out` is untouched on error.
Status decode_etcd_registry_entry(std::span<const std::byte> value, const DecodeLimits& limits,
                                  EtcdRegistryEntry* out);

}  // namespace pdr::proto
