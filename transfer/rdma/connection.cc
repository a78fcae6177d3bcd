// One RC connection's verbs objects (contract: connection.h).
#include "transfer/rdma/connection.h"

#include "transfer/rdma/qp_attrs.h"

namespace pdr::transfer::rdma {

bool Connection::post_recv(const VerbsApi& api, std::uint32_t slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<std::uintptr_t>(recv_slot(slot));
  sge.length = static_cast<std::uint32_t>(slot_bytes);
  sge.lkey = slab_mr->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = make_wr_id(WrKind::kRecv, gen, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return api.post_recv(qps[0].qp, &wr, &bad) == 0;
}

void Connection::destroy_verbs(const VerbsApi& api) {
  for (QpState& q : qps) {
    if (q.qp == nullptr) continue;
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    api.modify_qp(q.qp, &attr, IBV_QP_STATE);
    // After ibv_destroy_qp returns the NIC no longer accesses the QP's buffers (ibv_destroy_qp.3),
    // which is what lets a broken connection's tasks finish without waiting for flush CQEs.
    api.destroy_qp(q.qp);
    q.qp = nullptr;
  }
  if (slab_mr != nullptr) api.dereg_mr(slab_mr);
  slab_mr = nullptr;
}

Status create_connection(const Device& device, const ConnectionLimits& limits, std::uint32_t gen,
                         bool server, std::size_t qp_count, std::mt19937& rng,
                         std::unique_ptr<Connection>* out) {
  const VerbsApi& api = device.api();
  auto conn = std::make_unique<Connection>();
  conn->server = server;
  conn->gen = gen;
  conn->slot_bytes = limits.slot_bytes;
  conn->notify_slots = limits.notify_slots;
  const std::size_t slab_bytes = 2 * std::size_t{limits.notify_slots} * limits.slot_bytes;
  conn->slab = std::make_unique<std::byte[]>(slab_bytes);
  conn->slab_mr = api.reg_mr(device.pd(), conn->slab.get(), slab_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (conn->slab_mr == nullptr) return Status(StatusCode::kIoError, "ibv_reg_mr (slab) failed");
  conn->qps.resize(qp_count);
  for (std::size_t k = 0; k < qp_count; ++k) {
    QpState& q = conn->qps[k];
    ibv_qp_init_attr init{};
    init.send_cq = device.cq();
    init.recv_cq = device.cq();
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;  // selective signalling
    init.cap.max_send_wr = limits.max_send_wr;
    // Only QP 0 receives (notifies or replies); the others need no receive queue to speak of.
    init.cap.max_recv_wr = k == 0 ? limits.notify_slots : 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    q.qp = api.create_qp(device.pd(), &init);
    if (q.qp == nullptr) {
      conn->destroy_verbs(api);
      return Status(StatusCode::kIoError, "ibv_create_qp failed");
    }
    QpTransition t = build_init_transition(device.path());
    if (api.modify_qp(q.qp, &t.attr, t.mask) != 0) {
      conn->destroy_verbs(api);
      return Status(StatusCode::kIoError, "ibv_modify_qp(INIT) failed");
    }
    q.psn = rng() & proto::kRdmaMax24Bit;
    q.ring.resize(limits.max_send_wr);
    q.wrs.resize(limits.max_chain);
    q.sges.resize(limits.max_chain);
  }
  for (std::uint32_t slot = 0; slot < limits.notify_slots; ++slot) {
    conn->free_send_slots.push_back(slot);
    if (!conn->post_recv(api, slot)) {
      conn->destroy_verbs(api);
      return Status(StatusCode::kIoError, "ibv_post_recv failed");
    }
  }
  *out = std::move(conn);
  return Status::ok();
}

proto::RdmaHandshake local_record(const Device& device, const Connection& connection,
                                  const std::string& agent) {
  proto::RdmaHandshake record;
  record.gid = device.gid();
  record.lid = device.lid();
  record.port_num = device.path().port_num;
  record.path_mtu = static_cast<std::uint8_t>(device.path().active_mtu);
  record.gid_type = device.gid_type();
  record.max_rd_atomic = device.path().max_rd_atomic;
  for (const QpState& q : connection.qps) {
    record.qpn.push_back(q.qp->qp_num);
    record.psn.push_back(q.psn);
  }
  record.agent = agent.empty() ? std::string("unnamed") : agent;
  if (record.agent.size() > proto::kRdmaMaxAgentBytes) record.agent.resize(proto::kRdmaMaxAgentBytes);
  return record;
}

Status bring_up(const Device& device, Connection& connection, const proto::RdmaHandshake& remote) {
  if (remote.qpn.size() != connection.qps.size()) {
    return Status(StatusCode::kInvalidValue, "peer offered " + std::to_string(remote.qpn.size()) +
                                                 " QPs, expected " +
                                                 std::to_string(connection.qps.size()));
  }
  const VerbsApi& api = device.api();
  for (std::size_t k = 0; k < connection.qps.size(); ++k) {
    QpTransition rtr = build_rtr_transition(device.path(), remote, k);
    if (api.modify_qp(connection.qps[k].qp, &rtr.attr, rtr.mask) != 0) {
      return Status(StatusCode::kIoError, "ibv_modify_qp(RTR) failed");
    }
    QpTransition rts = build_rts_transition(device.path(), remote, connection.qps[k].psn);
    if (api.modify_qp(connection.qps[k].qp, &rts.attr, rts.mask) != 0) {
      return Status(StatusCode::kIoError, "ibv_modify_qp(RTS) failed");
    }
  }
  connection.rd_atomic = negotiated_rd_atomic(device.path(), remote);
  connection.remote_agent = remote.agent;
  return Status::ok();
}

}  // namespace pdr::transfer::rdma
