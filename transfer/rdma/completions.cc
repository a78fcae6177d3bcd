// The completion half of the RDMA data path (contract: completions.h).
#include "transfer/rdma/completions.h"

#include <span>
#include <string>

#include "transfer/rdma/notify_message.h"
#include "transfer/rdma/posting.h"

namespace pdr::transfer::rdma {

namespace {

// Retires every send WR of `q` up to sequence `upto`.
void retire(State& state, Connection& conn, QpState& q, std::uint64_t upto,
            std::vector<Finished>* finished) {
  while (q.retired < upto) {
    const std::uint64_t seq = ++q.retired;
    const SendEntry& e = q.ring[seq % q.ring.size()];
    if (e.kind != WrKind::kData) {
      conn.free_send_slots.push_back(e.slot);
      continue;
    }
    if (e.read) --q.reads_out;
    auto it = state.tasks.find(e.task_id);
    if (it == state.tasks.end()) continue;
    TaskState& t = it->second;
    --t.outstanding;
    t.bytes_done += e.bytes;
    if (t.outstanding == 0 && t.all_posted) data_complete(state, conn, e.task_id, finished);
  }
}

void handle_recv(State& state, Connection& conn, const ibv_wc& wc, std::uint32_t slot,
                 std::vector<Finished>* finished, std::vector<Delivery>* deliveries) {
  if (wc.status != IBV_WC_SUCCESS) {  // flushed: the QP went to ERR
    state.break_conn(conn.gen, XferCause::kPeerGone, finished);
    return;
  }
  if (slot >= state.options.notify_slots) return;
  NotifyMessage decoded;
  const bool ok = wc.byte_len <= conn.slot_bytes &&
                  decode_notify_message(std::span(conn.recv_slot(slot), wc.byte_len), &decoded) &&
                  decoded.type == (conn.server ? NotifyType::kNotify : NotifyType::kReply);
  if (!ok) {
    state.count(&EngineCounters::bad_frames);
    state.break_conn(conn.gen, XferCause::kBadFrame, finished);
    return;
  }
  const std::uint64_t id = decoded.xfer_id;
  const std::uint8_t status = decoded.status;
  // Copied out before the slot is reposted (the peer may overwrite it as soon as it is).
  std::string message(decoded.message);
  if (!conn.post_recv(state.device.api(), slot)) {
    state.break_conn(conn.gen, XferCause::kPeerGone, finished);
    return;
  }
  if (conn.server) {
    state.count(&EngineCounters::notifications_received);
    deliveries->push_back({conn.remote_agent, std::move(message)});
    // Sent by a later round, after the delivery above ran: the initiator's kDone then implies the
    // notification was handed to our engine.
    conn.reply_queue.emplace_back(id, 0);
    return;
  }
  if (conn.notifies_in_flight > 0) --conn.notifies_in_flight;
  auto it = state.tasks.find(id);
  if (it == state.tasks.end() || it->second.stage != Stage::kNotifySent ||
      it->second.conn_gen != conn.gen) {
    return;  // cancelled meanwhile
  }
  if (status != 0) {
    state.finish_task(id, {XferState::kFailed, XferCause::kAccess, it->second.bytes_done},
                      finished);
    return;
  }
  state.count(&EngineCounters::notifications_sent);
  state.finish_done(id, finished);
}

}  // namespace

void handle_completion(State& state, const ibv_wc& wc, std::vector<Finished>* finished,
                       std::vector<Delivery>* deliveries) {
  const WrId wr_id = parse_wr_id(wc.wr_id);
  auto it = state.conns.find(wr_id.gen);
  if (it == state.conns.end()) return;  // a torn-down connection's leftovers
  Connection& conn = *it->second;
  QpState* q = nullptr;
  for (QpState& cand : conn.qps) {
    if (cand.qp != nullptr && cand.qp->qp_num == wc.qp_num) q = &cand;
  }
  if (q == nullptr) return;
  if (wr_id.kind == WrKind::kRecv) {
    handle_recv(state, conn, wc, static_cast<std::uint32_t>(wr_id.low), finished, deliveries);
    return;
  }
  const std::uint64_t seq = wr_id.low;
  if (seq <= q->retired || seq >= q->next_seq) return;
  if (wc.status == IBV_WC_SUCCESS) {
    retire(state, conn, *q, seq, finished);
    return;
  }
  // The failed WR's predecessors completed (in-order retirement); it and everything after fail.
  retire(state, conn, *q, seq - 1, finished);
  const SendEntry& e = q->ring[seq % q->ring.size()];
  if (e.kind == WrKind::kData) {
    auto t = state.tasks.find(e.task_id);
    if (t != state.tasks.end() && t->second.failure == XferCause::kNone) {
      t->second.failure =
          wc.status == IBV_WC_REM_ACCESS_ERR ? XferCause::kAccess : XferCause::kPeerGone;
    }
  }
  state.break_conn(wr_id.gen, XferCause::kPeerGone, finished);
}

}  // namespace pdr::transfer::rdma
