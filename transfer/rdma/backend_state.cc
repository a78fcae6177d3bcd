// What the RDMA backend's threads share (contract: backend_state.h).
#include "transfer/rdma/backend_state.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "transfer/rdma/notify_message.h"

namespace pdr::transfer::rdma {

State::State(const RdmaBackendOptions& backend_options, VerbsLoader loader)
    : options(backend_options), load_verbs(loader) {
  options.qps_per_peer = std::clamp<std::uint32_t>(options.qps_per_peer, 1, proto::kRdmaMaxQps);
  options.max_send_wr = std::max<std::uint32_t>(options.max_send_wr, 2);
  if (options.signal_every == 0) {
    options.signal_every = std::max<std::uint32_t>(1, options.max_send_wr / 4);
  }
  options.slice_bytes = std::clamp<std::uint64_t>(options.slice_bytes, 4096, 1u << 30);
  options.notify_slots = std::max<std::uint32_t>(options.notify_slots, 1);
  limits.max_send_wr = options.max_send_wr;
  limits.notify_slots = options.notify_slots;
  limits.slot_bytes = kNotifyHeaderBytes + options.max_notify_bytes;
  // Half the ring per doorbell, so one round's chain never fills a QP on its own.
  limits.max_chain = std::max<std::uint32_t>(1, options.max_send_wr / 2);
}

// Each QP may have max_send_wr send CQEs and (on QP 0) notify_slots receive CQEs outstanding; the
// sum over live connections must fit the one CQ, or a CQ overrun would put every QP in error.
Status State::create_conn(bool server, std::size_t qp_count, Connection** out) {
  const std::uint64_t budget =
      qp_count * (std::uint64_t{options.max_send_wr} + options.notify_slots);
  if (qp_budget_used + budget > options.cq_depth) {
    return Status(StatusCode::kRejected, "rdma CQ depth " + std::to_string(options.cq_depth) +
                                             " cannot take another " + std::to_string(qp_count) +
                                             " QPs");
  }
  const std::uint32_t gen = next_gen;
  next_gen = (next_gen + 1) & kGenMask;
  if (next_gen == 0) next_gen = 1;
  std::unique_ptr<Connection> conn;
  if (Status s = create_connection(device, limits, gen, server, qp_count, rng, &conn); !s) {
    return s;
  }
  qp_budget_used += budget;
  *out = conn.get();
  conns[gen] = std::move(conn);
  return Status::ok();
}

void State::break_conn(std::uint32_t gen, XferCause cause, std::vector<Finished>* finished) {
  auto it = conns.find(gen);
  if (it == conns.end()) return;
  Connection& conn = *it->second;
  if (conn.ready) count(&EngineCounters::disconnects);
  if (conn.fd >= 0) {
    // The control thread owns a watched fd and closes it on the EOF this causes.
    if (conn.fd_watched) {
      ::shutdown(conn.fd, SHUT_RDWR);
    } else {
      ::close(conn.fd);
    }
  }
  conn.destroy_verbs(device.api());
  qp_budget_used -= conn.qps.size() * (std::uint64_t{options.max_send_wr} + options.notify_slots);
  std::vector<std::uint64_t> ids;
  for (const auto& [id, t] : tasks) {
    if (t.conn_gen == gen) ids.push_back(id);
  }
  for (std::uint64_t id : ids) {
    const TaskState& t = tasks[id];
    const XferCause cancel = t.task->cancel_cause();
    const XferResult result = cancel != XferCause::kNone
                                  ? cancel_result(cancel, t.bytes_done)
                                  : XferResult{XferState::kFailed,
                                               t.failure != XferCause::kNone ? t.failure : cause,
                                               t.bytes_done};
    finish_task(id, result, finished);
  }
  if (!conn.server) {
    auto peer = peers.find(conn.peer);
    if (peer != peers.end() && peer->second.conn_gen == gen) peer->second.conn_gen = 0;
  }
  conns.erase(it);
}

void State::fail_waiting(PeerState& peer, XferCause cause, std::vector<Finished>* finished) {
  for (std::uint64_t id : peer.waiting) {
    auto it = tasks.find(id);
    if (it == tasks.end()) continue;
    const XferCause cancel = it->second.task->cancel_cause();
    finish_task(id, cancel != XferCause::kNone ? cancel_result(cancel, 0)
                                               : XferResult{XferState::kFailed, cause, 0},
                finished);
  }
  peer.waiting.clear();
}

void State::finish_task(std::uint64_t id, const XferResult& result,
                        std::vector<Finished>* finished) {
  auto it = tasks.find(id);
  if (it == tasks.end()) return;
  finished->push_back({it->second.task, result});
  tasks.erase(it);
}

void State::finish_done(std::uint64_t id, std::vector<Finished>* finished) {
  auto it = tasks.find(id);
  if (it == tasks.end()) return;
  const TaskState& t = it->second;
  if (context.counters != nullptr && t.total > 0) {
    auto& counter = t.task->op() == XferOp::kWrite ? context.counters->bytes_written
                                                   : context.counters->bytes_read;
    counter.fetch_add(t.total, std::memory_order_relaxed);
  }
  finish_task(id, {XferState::kDone, XferCause::kNone, t.total}, finished);
}

void State::wake_io() {
  io_wake_pending = true;
  io_cv.notify_one();
}

void State::wake_control() const {
  const std::uint64_t one = 1;
  if (wake_fd >= 0) (void)!::write(wake_fd, &one, sizeof(one));
}

void State::count(std::atomic<std::uint64_t> EngineCounters::*counter) const {
  if (context.counters != nullptr) (context.counters->*counter).fetch_add(1, std::memory_order_relaxed);
}

void State::run_finished(std::vector<Finished>& finished) {
  for (Finished& f : finished) f.task->finish(f.result);
  finished.clear();
}

}  // namespace pdr::transfer::rdma
