// The send half of the RDMA data path: what the I/O thread posts on a ready connection each round.
//
// - Data (initiator): the tasks in conn.posting, in FIFO order, are cut into slices of at most
//   options.slice_bytes and spread round-robin over the QPs that have room: outstanding WRs
//   per QP <= max_send_wr, outstanding READs per QP <= the negotiated rd_atomic depth. Each QP's
//   slices of one round go out as one chained post_send, signalled every signal_every-th WR
//   and on the last WR of each task on that QP. A task that finds no room waits, and so does
//   every task behind it.
// - Notify (initiator, R-13 option B): once every data WR of a task has completed, a SEND on QP 0
//   carries {xfer_id, message} from a send slot; at most notify_slots are in flight per connection.
// - Reply (serving side): one SEND per notify received, answered in a later round than the one
//   that delivered the notification.
// A post_send the QP refuses puts the connection on State::broken_gens; the I/O thread then tears
// it down, which finishes its tasks.
//
// Threads: the I/O thread, with the backend lock (State::mu) held. Tasks that end here are
// appended to `finished` (task_state.h).
#pragma once

#include <cstdint>
#include <vector>

#include "transfer/rdma/backend_state.h"

namespace pdr::transfer::rdma {

// Posts what conn.posting has room for. True when it posted something or work is left.
bool post_tasks(State& state, Connection& conn, std::vector<Finished>* finished);
// Sends queued notifies while slots and QP 0 room last (initiator side).
void send_notifies(State& state, Connection& conn, std::vector<Finished>* finished);
// Sends queued replies while slots and QP 0 room last (serving side).
void send_replies(State& state, Connection& conn);
// Every data WR of task `id` has completed: finish it (cancelled, failed, or done without a
// notify) or queue its notify.
void data_complete(State& state, Connection& conn, std::uint64_t id,
                   std::vector<Finished>* finished);

}  // namespace pdr::transfer::rdma
