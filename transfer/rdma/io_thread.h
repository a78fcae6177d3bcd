// IoThread: the RDMA backend's data-path thread. Each round, with the backend lock held, it applies
// the cancels the engine asked for, posts what each ready connection has room for (posting.h:
// data and notifies on the initiator side, replies on the serving side), tears down the
// connections a refused post condemned, and polls up to 64 CQEs (completions.h). Then, with the
// lock released, it finishes the tasks that ended and delivers the notifications received
// (on_notification runs on this thread).
//
// Cancels: a task still waiting for its connection, or whose notify is queued or already sent,
// finishes at once; a task with data WRs on the wire stops posting and finishes once they have
// completed (or the connection is torn down), because a posted WR cannot be recalled and the NIC
// may touch the task's memory until then.
//
// Idle: there is no completion channel yet (R-12's armed-CQ blocking is future work), so a round
// that found nothing to do naps on State::io_cv, 200 us while recently busy and 1 ms after 50 ms
// without work. That bounds the latency of a peer-triggered CQE (an incoming notify, a reply); a
// local submit or cancel wakes the thread at once (State::wake_io).
//
// Threads: started and joined by the backend's start() and stop(); the loop ends once
// State::stopping is set and the thread is woken.
#pragma once

#include <vector>

#include "transfer/rdma/backend_state.h"

namespace pdr::transfer::rdma {

class IoThread final : public BackendThread {
 public:
  using BackendThread::BackendThread;

 private:
  void run() override;
  // With the lock held: applies State::cancels; true when there were any.
  bool process_cancels(std::vector<Finished>* finished);
};

}  // namespace pdr::transfer::rdma
