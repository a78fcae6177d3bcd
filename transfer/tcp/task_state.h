// Per-transfer bookkeeping of the TCP backend: a TaskState per submitted XferTask and one Batch per
// lane the task uses (docs/design/kv-transfer.md T-6 striping).
//
// Settling (the backend.h guarantees rest on this):
// - A Batch belongs to exactly one lane, hence to one I/O thread; only that thread reads or writes
//   it. settle_batch() marks it settled exactly once (ok, or the first failure cause) and from then
//   on the lane never reads or writes the task's memory for it again: a frame already half on the
//   wire is finished from a zero buffer, a READ_DATA half received is drained into scratch.
// - TaskState counts its unsettled batches atomically; the thread that settles the last one calls
//   TaskSink::on_batches_settled(), which either sends the notify (as one more batch) or finishes
//   the task. So finish() never runs while any lane may still touch the task's memory.
// - A Batch outlives its settling while frames or expected responses still name it (refs): late
//   answers are then matched and discarded.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transfer/backend.h"

namespace pdr::transfer::tcp {

using Clock = std::chrono::steady_clock;

struct TaskState {
  TaskState(XferTask* t, PeerId p) : task(t), peer(p) {}
  XferTask* const task;
  const PeerId peer;
  std::atomic<std::uint32_t> batches_left{0};
  std::atomic<XferCause> failure{XferCause::kNone};  // first failure wins
  std::atomic<std::uint64_t> bytes_done{0};          // bytes of batches that settled ok
  // Touched only by the thread that settles the last batch (the acq_rel count orders it).
  bool notify_posted = false;
  std::uint32_t notify_lane = 0;  // the lane that carried the last data piece (T-10)
};

enum class BatchKind : std::uint8_t { kWrite, kRead, kNotify };

struct Batch {
  TaskState* task = nullptr;  // null once settled: the task may be gone
  std::uint64_t xfer_id = 0;
  BatchKind kind = BatchKind::kWrite;
  std::vector<XferSegment> segments;  // a copy: valid after the task is gone
  std::string notify;                 // kNotify: the message
  std::uint64_t bytes = 0;            // payload bytes of this batch
  Clock::time_point queued_at{};
  std::uint32_t next_send = 0;        // next segment to put on the wire
  std::uint32_t responses_left = 0;   // kRead: READ_DATA still expected
  std::uint32_t refs = 0;             // lane queues / frames naming this batch
  bool settled = false;
};

class TaskSink {
 public:
  virtual ~TaskSink() = default;
  // Every batch of `state` is settled. Called on the I/O thread that settled the last one.
  virtual void on_batches_settled(TaskState* state) = 0;
};

// Settles `batch` once: cause kNone = success (its bytes count as done). Later calls do nothing.
void settle_batch(Batch* batch, XferCause cause, TaskSink& sink);

// Drops one reference; deletes the batch at zero.
inline void unref_batch(Batch* batch) {
  if (--batch->refs == 0) delete batch;
}

// The XferResult a task reports given its first failure (kNone: done).
XferResult task_result(const TaskState& state);

}  // namespace pdr::transfer::tcp
