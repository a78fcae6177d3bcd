#include "proto/etcd_registry_entry.h"

#include <utility>

#include "proto/msgpack_fields.h"
#include "proto/msgpack_limits.h"

namespace pdr::proto {

std::string encode_etcd_registry_entry(const Registration& registration, std::string_view admission) {
  if (admission.empty()) return encode_pdrouter_registration(registration, {});
  const std::pair<std::string_view, std::string_view> extra[] = {{kRegistryEntryAdmissionKey, admission}};
  return encode_pdrouter_registration(registration, extra);
}

Status decode_etcd_registry_entry(std::span<const std::byte> value, const DecodeLimits& limits,
                                  EtcdRegistryEntry* out) {
  DiscoveryMessage message;
  if (Status st = decode_discovery_message(value, limits, &message); !st) return st;
  if (message.kind != DiscoveryMessage::Kind::kRegistration) {
    return Status(StatusCode::kUnknownType, "a registry entry must be a registration");
  }
  // The registration decoder skips keys it does not know: read ours from the same bytes (they
  // decoded above, so this second pass cannot fail on size, depth or shape).
  msgpack::object_handle handle;
  FieldMap fields;
  if (Status st = unpack_bounded(value, limits, &handle); !st) return st;
  if (Status st = FieldMap::build(handle.get(), "payload", &fields); !st) return st;
  std::string admission;
  if (const msgpack::object* field = fields.find(kRegistryEntryAdmissionKey)) {
    if (Status st = as_string(*field, kRegistryEntryAdmissionKey, kMaxRegistryEntryAdmissionBytes, &admission); !st) {
      return st;
    }
  }
  out->registration = std::move(message.registration);
  out->admission = std::move(admission);
  return Status::ok();
}

}  // namespace pdr::proto
