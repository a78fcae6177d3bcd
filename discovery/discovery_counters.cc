#include "discovery/discovery_counters.h"

namespace pdr::discovery {

std::string_view to_string(RejectReason r) {
  switch (r) {
    case RejectReason::kMalformed: return "malformed";
    case RejectReason::kTooLarge: return "too_large";
    case RejectReason::kTooDeep: return "too_deep";
    case RejectReason::kMissingKey: return "missing_key";
    case RejectReason::kWrongType: return "wrong_type";
    case RejectReason::kBadAddress: return "bad_address";
    case RejectReason::kOutOfRange: return "out_of_range";
    case RejectReason::kInvalidValue: return "invalid_value";
    case RejectReason::kUnknownType: return "unknown_type";
    case RejectReason::kUnauthenticated: return "unauthenticated";
    case RejectReason::kBadFrames: return "bad_frames";
    case RejectReason::kRegistryFull: return "registry_full";
    case RejectReason::kStaleGoodbye: return "stale_goodbye";
    case RejectReason::kUnknownGoodbye: return "unknown_goodbye";
    case RejectReason::kNotSelf: return "not_own_address";
    case RejectReason::kWeakerSender: return "weaker_sender";
    case RejectReason::kStaleEpoch: return "stale_epoch";
    case RejectReason::kClassFull: return "class_full";
    case RejectReason::kOperatorOwned: return "operator_owned";
    case RejectReason::kHostName: return "host_name";
    case RejectReason::kCount: break;
  }
  return "unknown";
}

RejectReason reject_reason_for(StatusCode code) {
  switch (code) {
    case StatusCode::kTooLarge: return RejectReason::kTooLarge;
    case StatusCode::kTooDeep: return RejectReason::kTooDeep;
    case StatusCode::kMissingKey: return RejectReason::kMissingKey;
    case StatusCode::kWrongType: return RejectReason::kWrongType;
    case StatusCode::kBadAddress: return RejectReason::kBadAddress;
    case StatusCode::kOutOfRange: return RejectReason::kOutOfRange;
    case StatusCode::kInvalidValue: return RejectReason::kInvalidValue;
    case StatusCode::kUnknownType: return RejectReason::kUnknownType;
    case StatusCode::kUnauthenticated: return RejectReason::kUnauthenticated;
    default: return RejectReason::kMalformed;
  }
}

uint64_t DiscoveryCounters::rejected_total() const {
  uint64_t total = 0;
  for (const auto& c : rejected) total += c.load(std::memory_order_relaxed);
  return total;
}

}  // namespace pdr::discovery
