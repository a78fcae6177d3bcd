// Per-transfer bookkeeping of the RDMA backend: one TaskState per submitted XferTask, in
// State::tasks (backend_state.h) from submit() until the task is finished, touched only with the
// backend lock held.
//
// Stages of a task (the order is the notify-after-data guarantee of backend.h):
//   kWaiting       queued on its peer until the connector thread has a connection up
//   kPosting       in its connection's `posting` queue; data WRs go out as QPs have room
//   kNotifyQueued  every data WR completed; the notify SEND waits for a send slot
//   kNotifySent    the notify is out; the peer's reply finishes the task
// A task without a notify finishes kDone once its data WRs completed.
//
// Finishing: code under the lock never calls XferTask::finish(); it appends a Finished entry and
// the thread runs the entries once it has released the lock (State::run_finished), so the engine
// may call back into the backend from finish(). Notifications received on the serving side travel
// the same way as Delivery entries, run by the I/O thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transfer/backend.h"

namespace pdr::transfer::rdma {

enum class Stage : std::uint8_t { kWaiting, kPosting, kNotifyQueued, kNotifySent };

struct TaskState {
  XferTask* task = nullptr;
  PeerId peer = kInvalidPeer;
  std::uint32_t conn_gen = 0;  // the connection carrying it, from kPosting on
  Stage stage = Stage::kWaiting;
  std::size_t seg = 0;          // next segment to post
  std::uint64_t seg_off = 0;    // bytes of it already posted
  std::uint32_t outstanding = 0;  // data WRs posted and not yet completed
  bool all_posted = false;
  bool stop_posting = false;  // cancelled or failed while posting: post nothing more
  std::uint64_t total = 0;
  std::uint64_t bytes_done = 0;
  XferCause failure = XferCause::kNone;
};

struct Finished {
  XferTask* task;
  XferResult result;
};
struct Delivery {
  std::string from;
  std::string message;
};

// How a task the engine asked to cancel ends: kTimeout is a failure, anything else a cancel.
inline XferResult cancel_result(XferCause cause, std::uint64_t bytes) {
  if (cause == XferCause::kTimeout) return {XferState::kFailed, XferCause::kTimeout, bytes};
  return {XferState::kCancelled, XferCause::kCancelled, bytes};
}

}  // namespace pdr::transfer::rdma
