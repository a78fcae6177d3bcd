// The completion half of the RDMA data path: what the I/O thread does with each CQE it polls.
//
// - A send CQE retires its WR and every earlier one of its QP (RC completes a send queue in order,
//   and most WRs are unsignalled, posting.h): data WRs count toward their task, whose notify is
//   queued (or which finishes) when its last one completed; notify and reply WRs free their slot.
// - A receive CQE on the serving side is a notify: it is decoded, its slot is posted again, the
//   message goes to `deliveries` (on_notification, run later by the I/O thread without the lock) and
//   a reply is queued for a later round, so the initiator's kDone implies the delivery happened. On
//   the initiator side it is the reply that finishes its task kDone (or kAccess if the peer
//   refused).
// - Errors: an error CQE fails the task whose WR failed (IBV_WC_REM_ACCESS_ERR: kAccess,
//   else kPeerGone) and breaks the connection, which fails its other tasks kPeerGone; a receive
//   that does not decode as the expected message counts bad_frames and breaks it with kBadFrame.
//   CQEs of a connection already torn down (an older generation) are dropped.
//
// Threads: the I/O thread, with the backend lock (State::mu) held.
#pragma once

#include <vector>

#include "transfer/rdma/backend_state.h"

namespace pdr::transfer::rdma {

void handle_completion(State& state, const ibv_wc& wc, std::vector<Finished>* finished,
                       std::vector<Delivery>* deliveries);

}  // namespace pdr::transfer::rdma
