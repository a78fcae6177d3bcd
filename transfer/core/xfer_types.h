// The request and result vocabulary every backend shares: operation, state, error cause and the
// completion record a finished transfer reports (docs/design/kv-transfer.md, Engine API, "Errors").
#pragma once

#include <cstdint>
#include <string_view>

namespace pdr::transfer {

// kWrite: local -> remote. kRead: remote -> local.
enum class XferOp : std::uint8_t { kRead = 0, kWrite };

// kPending until the backend completes the transfer; the three final states never change again.
enum class XferState : std::uint8_t { kPending = 0, kDone, kFailed, kCancelled };

// Why a transfer did not finish as kDone. kNone for kDone and kPending.
enum class XferCause : std::uint8_t {
  kNone = 0,
  kAccess,     // a region/offset/length failed a bounds or permission check (either side)
  kTimeout,    // the request's deadline passed
  kPeerGone,   // the connection to the peer was lost or the peer went away
  kCancelled,  // cancelled by the initiator
  kBadFrame,   // the peer sent a frame that does not decode or violates the protocol
  kInternal,   // a local failure (out of resources, syscall error) not caused by the peer
};

struct XferResult {
  XferState state = XferState::kPending;
  XferCause cause = XferCause::kNone;
  std::uint64_t bytes_done = 0;  // bytes known to have landed; for kDone, the whole transfer
  bool operator==(const XferResult&) const = default;
};

// Stable snake_case labels for logs and metrics.
std::string_view xfer_op_label(XferOp op);
std::string_view xfer_state_label(XferState state);
std::string_view xfer_cause_label(XferCause cause);

inline bool is_final(XferState state) { return state != XferState::kPending; }

}  // namespace pdr::transfer
