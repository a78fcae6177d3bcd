#include "transfer/core/xfer_types.h"

namespace pdr::transfer {

std::string_view xfer_op_label(XferOp op) {
  switch (op) {
    case XferOp::kRead: return "read";
    case XferOp::kWrite: return "write";
  }
  return "unknown";
}

std::string_view xfer_state_label(XferState state) {
  switch (state) {
    case XferState::kPending: return "pending";
    case XferState::kDone: return "done";
    case XferState::kFailed: return "failed";
    case XferState::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string_view xfer_cause_label(XferCause cause) {
  switch (cause) {
    case XferCause::kNone: return "none";
    case XferCause::kAccess: return "access";
    case XferCause::kTimeout: return "timeout";
    case XferCause::kPeerGone: return "peer_gone";
    case XferCause::kCancelled: return "cancelled";
    case XferCause::kBadFrame: return "bad_frame";
    case XferCause::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace pdr::transfer
