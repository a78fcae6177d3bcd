// The send half of the RDMA data path (contract: posting.h).
#include "transfer/rdma/posting.h"

#include <algorithm>
#include <span>
#include <string>

#include "transfer/rdma/notify_message.h"

namespace pdr::transfer::rdma {

namespace {

// The first QP, round-robin from conn.rr, that can take one more WR of this kind (R-10 bounds).
QpState* pick_qp(const State& state, Connection& conn, bool read) {
  const std::size_t k_count = conn.qps.size();
  for (std::size_t n = 0; n < k_count; ++n) {
    QpState& cand = conn.qps[(conn.rr + n) % k_count];
    if (cand.outstanding() + cand.chain >= state.options.max_send_wr ||
        cand.chain >= state.limits.max_chain) {
      continue;
    }
    if (read && cand.reads_out + cand.chain_reads >= conn.rd_atomic) continue;
    conn.rr = static_cast<std::uint32_t>((conn.rr + n + 1) % k_count);
    return &cand;
  }
  return nullptr;
}

// Rings one doorbell per QP for the chain built this round, signalling every
// signal_every-th WR and the last WR of each task on the QP: RC retires a send queue in
// order, so the signalled CQE of a task's last WR retires all of its earlier unsignalled ones.
bool flush_chains(State& state, Connection& conn) {
  bool posted = false;
  for (QpState& q : conn.qps) {
    if (q.chain == 0) continue;
    for (std::uint32_t i = 0; i < q.chain; ++i) {
      const std::uint64_t seq = q.next_seq + i;
      const bool last_of_task =
          i + 1 == q.chain ||
          q.ring[seq % q.ring.size()].task_id != q.ring[(seq + 1) % q.ring.size()].task_id;
      q.wrs[i].send_flags =
          (last_of_task || seq % state.options.signal_every == 0) ? IBV_SEND_SIGNALED : 0;
      q.wrs[i].next = i + 1 < q.chain ? &q.wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int rc = state.device.api().post_send(q.qp, q.wrs.data(), &bad);
    // On a refused post, WRs before `bad` went out; count them so their CQEs retire correctly.
    const std::uint32_t accepted =
        rc == 0 ? q.chain : static_cast<std::uint32_t>(bad != nullptr ? bad - q.wrs.data() : 0);
    q.next_seq += accepted;
    q.reads_out += rc == 0 ? q.chain_reads : 0;
    q.chain = 0;
    q.chain_reads = 0;
    posted = true;
    if (rc != 0) {
      // The QP refuses work (it is not in RTS any more): the WRs after `bad` will never complete,
      // so the I/O loop tears the connection down, which finishes its tasks.
      state.broken_gens.push_back(conn.gen);
    }
  }
  return posted;
}

// One signalled SEND on QP 0 from send slot `slot` (a notify or a reply).
bool post_single(State& state, Connection& conn, WrKind kind, std::uint64_t task_id,
                 std::uint32_t slot, std::uint32_t length) {
  QpState& q = conn.qps[0];
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(conn.send_slot(slot));
  sge.length = length;
  sge.lkey = conn.slab_mr->lkey;
  ibv_send_wr wr{};
  const std::uint64_t seq = q.next_seq;
  wr.wr_id = make_wr_id(kind, conn.gen, seq);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  q.ring[seq % q.ring.size()] = SendEntry{task_id, kind, false, length, slot};
  ibv_send_wr* bad = nullptr;
  if (state.device.api().post_send(q.qp, &wr, &bad) != 0) {
    state.broken_gens.push_back(conn.gen);
    conn.free_send_slots.push_back(slot);
    return false;
  }
  ++q.next_seq;
  return true;
}

}  // namespace

bool post_tasks(State& state, Connection& conn, std::vector<Finished>* finished) {
  if (conn.posting.empty()) return false;
  auto peer_it = state.peers.find(conn.peer);
  if (peer_it == state.peers.end()) return false;
  const PeerState& peer = peer_it->second;
  bool blocked = false;
  while (!conn.posting.empty() && !blocked) {
    const std::uint64_t id = conn.posting.front();
    auto it = state.tasks.find(id);
    if (it == state.tasks.end()) {
      conn.posting.pop_front();
      continue;
    }
    TaskState& t = it->second;
    const auto segments = t.task->segments();
    const bool read = t.task->op() == XferOp::kRead;
    while (!t.stop_posting && t.seg < segments.size()) {
      const XferSegment& seg = segments[t.seg];
      if (seg.length == t.seg_off) {
        ++t.seg;
        t.seg_off = 0;
        continue;
      }
      QpState* q = pick_qp(state, conn, read);
      if (q == nullptr) {
        blocked = true;
        break;
      }
      auto mr = state.mrs.find(seg.local_region);
      auto remote = peer.regions.find(seg.remote_region);
      if (mr == state.mrs.end() || remote == peer.regions.end()) {
        // Unregistered since submit: the engine must quiesce first; fail rather than touch it.
        t.failure = XferCause::kInternal;
        t.stop_posting = true;
        break;
      }
      const std::uint64_t length = std::min(seg.length - t.seg_off, state.options.slice_bytes);
      const std::uint32_t i = q->chain++;
      ibv_sge& sge = q->sges[i];
      sge.addr = reinterpret_cast<std::uintptr_t>(seg.local_addr) + t.seg_off;
      sge.length = static_cast<std::uint32_t>(length);
      sge.lkey = mr->second->lkey;
      ibv_send_wr& wr = q->wrs[i];
      wr = ibv_send_wr{};
      const std::uint64_t seq = q->next_seq + i;
      wr.wr_id = make_wr_id(WrKind::kData, conn.gen, seq);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wr.wr.rdma.remote_addr = remote->second.addr + seg.remote_offset + t.seg_off;
      wr.wr.rdma.rkey = remote->second.rkey;
      q->ring[seq % q->ring.size()] = SendEntry{id, WrKind::kData, read,
                                                static_cast<std::uint32_t>(length), 0};
      if (read) ++q->chain_reads;
      ++t.outstanding;
      t.seg_off += length;
    }
    if (blocked) break;
    conn.posting.pop_front();
    t.all_posted = true;
    if (t.outstanding == 0) {
      // Nothing in flight for it (bare notify, or stopped before its first WR).
      const XferCause cancel = t.task->cancel_cause();
      if (cancel != XferCause::kNone) {
        state.finish_task(id, cancel_result(cancel, t.bytes_done), finished);
      } else if (t.failure != XferCause::kNone) {
        state.finish_task(id, {XferState::kFailed, t.failure, t.bytes_done}, finished);
      } else {
        data_complete(state, conn, id, finished);
      }
    }
  }
  return flush_chains(state, conn) || !conn.posting.empty();
}

void send_notifies(State& state, Connection& conn, std::vector<Finished>* finished) {
  QpState& q = conn.qps[0];
  while (!conn.notify_queue.empty() && conn.notifies_in_flight < state.options.notify_slots &&
         !conn.free_send_slots.empty() && q.outstanding() < state.options.max_send_wr) {
    const std::uint64_t id = conn.notify_queue.front();
    conn.notify_queue.pop_front();
    auto it = state.tasks.find(id);
    if (it == state.tasks.end()) continue;
    TaskState& t = it->second;
    if (const XferCause cancel = t.task->cancel_cause(); cancel != XferCause::kNone) {
      state.finish_task(id, cancel_result(cancel, t.bytes_done), finished);
      continue;
    }
    const std::string& message = t.task->notify();
    const std::uint32_t slot = conn.free_send_slots.back();
    conn.free_send_slots.pop_back();
    const std::size_t size = encode_notify_message(
        {NotifyType::kNotify, 0, id, message}, std::span(conn.send_slot(slot), conn.slot_bytes));
    if (!post_single(state, conn, WrKind::kNotify, id, slot, static_cast<std::uint32_t>(size))) {
      return;
    }
    t.stage = Stage::kNotifySent;
    ++conn.notifies_in_flight;
  }
}

void send_replies(State& state, Connection& conn) {
  QpState& q = conn.qps[0];
  while (!conn.reply_queue.empty() && !conn.free_send_slots.empty() &&
         q.outstanding() < state.options.max_send_wr) {
    const auto [id, status] = conn.reply_queue.front();
    conn.reply_queue.pop_front();
    const std::uint32_t slot = conn.free_send_slots.back();
    conn.free_send_slots.pop_back();
    const std::size_t size = encode_notify_message(
        {NotifyType::kReply, status, id, {}}, std::span(conn.send_slot(slot), conn.slot_bytes));
    if (!post_single(state, conn, WrKind::kReply, 0, slot, static_cast<std::uint32_t>(size))) {
      return;
    }
  }
}

// The bytes are in the peer's memory (WRITE: RC's completion follows the responder's ACK) or in
// ours (READ), so the notify may go now (R-13 B).
void data_complete(State& state, Connection& conn, std::uint64_t id,
                   std::vector<Finished>* finished) {
  auto it = state.tasks.find(id);
  if (it == state.tasks.end()) return;
  TaskState& t = it->second;
  if (const XferCause cancel = t.task->cancel_cause(); cancel != XferCause::kNone) {
    state.finish_task(id, cancel_result(cancel, t.bytes_done), finished);
  } else if (t.failure != XferCause::kNone) {
    state.finish_task(id, {XferState::kFailed, t.failure, t.bytes_done}, finished);
  } else if (t.task->notify().empty()) {
    state.finish_done(id, finished);
  } else {
    t.stage = Stage::kNotifyQueued;
    conn.notify_queue.push_back(id);
  }
}

}  // namespace pdr::transfer::rdma
