// The RDMA backend's data-path thread (contract: io_thread.h).
#include "transfer/rdma/io_thread.h"

#include <algorithm>
#include <chrono>

#include "transfer/rdma/completions.h"
#include "transfer/rdma/posting.h"

namespace pdr::transfer::rdma {

namespace {

constexpr int kPollBatch = 64;
// Nap lengths (io_thread.h): kIdleNap while recently busy, kLongNap after kLongIdle without work.
constexpr auto kIdleNap = std::chrono::microseconds(200);
constexpr auto kLongNap = std::chrono::milliseconds(1);
constexpr auto kLongIdle = std::chrono::milliseconds(50);

}  // namespace

void IoThread::run() {
  std::vector<ibv_wc> wcs(kPollBatch);
  std::vector<Finished> finished;
  std::vector<Delivery> deliveries;
  std::vector<Connection*> conns;
  auto last_work = std::chrono::steady_clock::now();
  for (;;) {
    bool worked = false;
    {
      std::lock_guard lock(state_.mu);
      if (state_.stopping) break;
      worked |= process_cancels(&finished);
      conns.clear();
      for (auto& [gen, conn] : state_.conns) {
        if (conn->ready) conns.push_back(conn.get());
      }
      for (Connection* conn : conns) {
        if (conn->server) {
          send_replies(state_, *conn);
          worked |= !conn->reply_queue.empty();
        } else {
          worked |= post_tasks(state_, *conn, &finished);
          send_notifies(state_, *conn, &finished);
        }
      }
      for (std::uint32_t gen : state_.broken_gens) {
        state_.break_conn(gen, XferCause::kPeerGone, &finished);
      }
      state_.broken_gens.clear();
      const int n = state_.device.api().poll_cq(state_.device.cq(), kPollBatch, wcs.data());
      for (int i = 0; i < n; ++i) {
        handle_completion(state_, wcs[static_cast<std::size_t>(i)], &finished, &deliveries);
      }
      worked |= n > 0;
    }
    worked |= !finished.empty() || !deliveries.empty();
    State::run_finished(finished);
    for (const Delivery& d : deliveries) {
      if (state_.context.on_notification) state_.context.on_notification(d.from, d.message);
    }
    deliveries.clear();
    const auto now = std::chrono::steady_clock::now();
    if (worked) {
      last_work = now;
    } else {
      const auto nap = now - last_work > kLongIdle
                           ? std::chrono::duration_cast<std::chrono::microseconds>(kLongNap)
                           : kIdleNap;
      std::unique_lock lock(state_.mu);
      state_.io_cv.wait_for(lock, nap,
                            [this] { return state_.stopping || state_.io_wake_pending; });
      state_.io_wake_pending = false;
    }
  }
}

bool IoThread::process_cancels(std::vector<Finished>* finished) {
  if (state_.cancels.empty()) return false;
  for (std::uint64_t id : state_.cancels) {
    auto it = state_.tasks.find(id);
    if (it == state_.tasks.end()) continue;
    TaskState& t = it->second;
    const XferCause cause = t.task->cancel_cause();
    if (cause == XferCause::kNone) continue;
    Connection* conn = nullptr;
    if (auto c = state_.conns.find(t.conn_gen); t.conn_gen != 0 && c != state_.conns.end()) {
      conn = c->second.get();
    }
    const XferResult result = cancel_result(cause, t.bytes_done);
    switch (t.stage) {
      case Stage::kWaiting: {
        auto& waiting = state_.peers[t.peer].waiting;
        waiting.erase(std::remove(waiting.begin(), waiting.end(), id), waiting.end());
        state_.finish_task(id, result, finished);
        break;
      }
      case Stage::kPosting:
        // A posted WR cannot be recalled: stop posting more and finish once the posted ones have
        // completed (or the connection is torn down), so the NIC no longer touches the memory.
        t.stop_posting = true;
        if (t.outstanding == 0) {
          if (conn != nullptr) {
            conn->posting.erase(std::remove(conn->posting.begin(), conn->posting.end(), id),
                                conn->posting.end());
          }
          state_.finish_task(id, result, finished);
        }
        break;
      case Stage::kNotifyQueued:
        if (conn != nullptr) {
          conn->notify_queue.erase(
              std::remove(conn->notify_queue.begin(), conn->notify_queue.end(), id),
              conn->notify_queue.end());
        }
        state_.finish_task(id, result, finished);
        break;
      case Stage::kNotifySent:
        // The data is complete and the notify is out: no local memory is in use any more; the
        // reply, if it comes, finds no task and is dropped.
        state_.finish_task(id, result, finished);
        break;
    }
  }
  state_.cancels.clear();
  return true;
}

}  // namespace pdr::transfer::rdma
