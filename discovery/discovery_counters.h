// Counters the discovery thread updates and /metrics reads. Plain relaxed atomics: each is a
// monotonically increasing total; readers need no consistency between them.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

#include "discovery/zap_policy.h"
#include "proto/base/status.h"

namespace pdr::discovery {

// Why a frame changed nothing. Decoder failures use the StatusCode labels; the rest are the
// listener's own reasons.
enum class RejectReason : uint8_t {
  kMalformed, kTooLarge, kTooDeep, kMissingKey, kWrongType, kBadAddress, kOutOfRange,
  kInvalidValue, kUnknownType, kUnauthenticated,
  kBadFrames,      // not exactly [identity, payload]
  kRegistryFull,   // max_instances reached, nothing expired to evict
  kStaleGoodbye,   // goodbye from an older epoch than the live entry
  kUnknownGoodbye, // goodbye for an address that is not registered
  kNotSelf,        // an unauthenticated sender named an IP address other than its own
  kWeakerSender,   // the entry was created by a stronger admission class
  kStaleEpoch,     // registration from an older epoch than the live entry
  kClassFull,      // the sender's admission class reached discovery.max_instances_per_class
  kOperatorOwned,  // goodbye for a static or admin instance
  kHostName,       // an unauthenticated sender named a host name (never resolved)
  kCount
};
std::string_view to_string(RejectReason);
RejectReason reject_reason_for(StatusCode code);

struct DiscoveryCounters {
  using Counter = std::atomic<uint64_t>;
  Counter frames_received{0};
  std::array<Counter, 5> accepted_by_format{};  // index: proto::RegistrationFormat (not kStatic)
  Counter hellos{0};
  Counter goodbyes{0};
  std::array<Counter, static_cast<size_t>(RejectReason::kCount)> rejected{};
  Counter added{0};
  Counter restarts{0};
  Counter revived{0};
  Counter expiries{0};
  Counter removed_after_retention{0};
  Counter acks_sent{0};
  Counter peer_connections{0};   // TCP connections accepted by the ROUTER socket
  Counter peer_disconnects{0};   // includes peers libzmq dropped for frames over the hard limit
  Counter snapshots_published{0};
  Counter handshakes_admitted{0};  // connections the ZAP policy admitted
  std::array<Counter, kHandshakeRefusals> handshakes_refused{};  // index: HandshakeRefusal

  void refuse_handshake(HandshakeRefusal r) {
    handshakes_refused[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  void reject(RejectReason r) { rejected[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t rejected_total() const;
};

}  // namespace pdr::discovery
