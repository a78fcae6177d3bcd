#include "transfer/tcp/task_state.h"

namespace pdr::transfer::tcp {

void settle_batch(Batch* batch, XferCause cause, TaskSink& sink) {
  if (batch->settled) return;
  batch->settled = true;
  TaskState* state = batch->task;
  batch->task = nullptr;
  if (cause == XferCause::kNone) {
    state->bytes_done.fetch_add(batch->bytes, std::memory_order_relaxed);
  } else {
    XferCause expected = XferCause::kNone;
    state->failure.compare_exchange_strong(expected, cause, std::memory_order_acq_rel);
  }
  // acq_rel: the last settler sees every other lane's writes to the task's memory and state.
  if (state->batches_left.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    sink.on_batches_settled(state);
  }
}

XferResult task_result(const TaskState& state) {
  const XferCause cause = state.failure.load(std::memory_order_acquire);
  const std::uint64_t done = state.bytes_done.load(std::memory_order_relaxed);
  if (cause == XferCause::kNone) return {XferState::kDone, XferCause::kNone, state.task->total_bytes()};
  if (cause == XferCause::kCancelled) return {XferState::kCancelled, cause, done};
  return {XferState::kFailed, cause, done};
}

}  // namespace pdr::transfer::tcp
