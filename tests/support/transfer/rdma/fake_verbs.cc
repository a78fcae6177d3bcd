// The fake NIC (contract: fake_verbs.h). Every verbs object is a struct whose first member is the
// real ibv_* struct, so the pointers the backend holds are genuine ibv_* pointers and the fake
// gets its own state back with a cast.
#include "tests/support/transfer/rdma/fake_verbs.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace pdr::transfer::rdma {

namespace {

struct FakeDevice {
  ibv_device device{};
};
struct FakeContext {
  ibv_context context{};
};
struct FakePd {
  ibv_pd pd{};
};
struct FakeMr {
  ibv_mr mr{};
  int access = 0;
};
struct FakeCq {
  ibv_cq cq{};
  std::size_t capacity = 0;
  std::deque<ibv_wc> entries;
};
struct FakeRecv {
  std::uint64_t wr_id = 0;
  std::vector<ibv_sge> sges;
};
struct FakeQp {
  ibv_qp qp{};
  FakeCq* send_cq = nullptr;
  FakeCq* recv_cq = nullptr;
  bool sq_sig_all = false;
  std::uint32_t max_send_sge = 1;
  std::uint32_t max_recv_wr = 1;
  std::uint32_t max_recv_sge = 1;
  int access = 0;
  std::uint32_t dest_qpn = 0;
  std::uint32_t rq_psn = 0;
  std::uint32_t sq_psn = 0;
  std::deque<FakeRecv> recvs;
};

template <typename Fake, typename Verbs>
Fake* fake_of(Verbs* object) {
  return reinterpret_cast<Fake*>(object);  // the ibv struct is the first member
}

class Nic {
 public:
  static Nic& get() {
    static Nic nic;
    return nic;
  }

  std::mutex mu;
  FakeDevice device;
  int device_count = 1;
  std::uint32_t next_key = 0x100;
  std::uint32_t next_qpn = 0x11;
  std::unordered_map<std::uint32_t, FakeMr*> by_lkey;
  std::unordered_map<std::uint32_t, FakeMr*> by_rkey;
  std::unordered_map<std::uint32_t, FakeQp*> qps;
  FakeNicStats stats;
  std::uint64_t fail_countdown = 0;
  ibv_wc_status fail_status = IBV_WC_RETRY_EXC_ERR;

  Nic() {
    std::strncpy(device.device.name, "fake_rxe0", sizeof(device.device.name) - 1);
    std::strncpy(device.device.dev_name, "uverbs_fake0", sizeof(device.device.dev_name) - 1);
    device.device.transport_type = IBV_TRANSPORT_IB;
    device.device.node_type = IBV_NODE_CA;
  }

  void push(FakeCq* cq, const ibv_wc& wc) {
    if (cq->entries.size() >= cq->capacity) ++stats.cq_overruns;
    cq->entries.push_back(wc);
  }

  void flush_recvs(FakeQp* qp) {
    while (!qp->recvs.empty()) {
      ibv_wc wc{};
      wc.wr_id = qp->recvs.front().wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = qp->qp.qp_num;
      qp->recvs.pop_front();
      ++stats.recv_cqes;
      push(qp->recv_cq, wc);
    }
  }

  void to_error(FakeQp* qp) {
    qp->qp.state = IBV_QPS_ERR;
    flush_recvs(qp);
  }

  // A local SGE list must lie inside MRs named by their lkeys (LOCAL_WRITE when we write into it).
  bool check_local(const ibv_sge* sges, int count, bool writing) {
    for (int i = 0; i < count; ++i) {
      auto it = by_lkey.find(sges[i].lkey);
      if (it == by_lkey.end()) return false;
      const ibv_mr& mr = it->second->mr;
      const auto base = reinterpret_cast<std::uintptr_t>(mr.addr);
      if (sges[i].addr < base || sges[i].addr - base > mr.length ||
          sges[i].length > mr.length - (sges[i].addr - base)) {
        return false;
      }
      if (writing && (it->second->access & IBV_ACCESS_LOCAL_WRITE) == 0) return false;
    }
    return true;
  }

  // The remote target [addr, addr + length) must lie in the rkey's MR, on the peer's PD, with the
  // access flag the operation needs.
  std::byte* check_remote(FakeQp* peer, std::uint32_t rkey, std::uint64_t addr,
                          std::uint64_t length, int flag) {
    auto it = by_rkey.find(rkey);
    if (it == by_rkey.end()) return nullptr;
    const ibv_mr& mr = it->second->mr;
    if (mr.pd != peer->qp.pd || (it->second->access & flag) == 0 ||
        (peer->access & flag) == 0) {
      return nullptr;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(mr.addr);
    if (addr < base || addr - base > mr.length || length > mr.length - (addr - base)) {
      return nullptr;
    }
    return reinterpret_cast<std::byte*>(addr);
  }

  static std::uint64_t sge_total(const ibv_sge* sges, int count) {
    std::uint64_t total = 0;
    for (int i = 0; i < count; ++i) total += sges[i].length;
    return total;
  }

  // Executes one WR; returns its completion status. *remote_error: the peer QP must go to ERR too.
  ibv_wc_status execute(FakeQp* qp, const ibv_send_wr& wr, std::uint32_t* byte_len,
                        bool* remote_error) {
    *remote_error = false;
    auto peer_it = qps.find(qp->dest_qpn);
    if (peer_it == qps.end()) return IBV_WC_RETRY_EXC_ERR;
    FakeQp* peer = peer_it->second;
    if ((peer->qp.state != IBV_QPS_RTR && peer->qp.state != IBV_QPS_RTS) ||
        peer->dest_qpn != qp->qp.qp_num || peer->rq_psn != qp->sq_psn) {
      return IBV_WC_RETRY_EXC_ERR;
    }
    if (wr.num_sge < 0 || static_cast<std::uint32_t>(wr.num_sge) > qp->max_send_sge) {
      return IBV_WC_LOC_LEN_ERR;
    }
    const bool inline_data = (wr.send_flags & IBV_SEND_INLINE) != 0 && wr.opcode != IBV_WR_RDMA_READ;
    const bool reading = wr.opcode == IBV_WR_RDMA_READ;
    if (!inline_data && !check_local(wr.sg_list, wr.num_sge, reading)) return IBV_WC_LOC_PROT_ERR;
    const std::uint64_t total = sge_total(wr.sg_list, wr.num_sge);
    *byte_len = static_cast<std::uint32_t>(total);
    switch (wr.opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM: {
        std::byte* target = check_remote(peer, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, total,
                                         IBV_ACCESS_REMOTE_WRITE);
        if (target == nullptr) {
          *remote_error = true;
          return IBV_WC_REM_ACCESS_ERR;
        }
        if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && peer->recvs.empty()) {
          return IBV_WC_RNR_RETRY_EXC_ERR;
        }
        for (int i = 0; i < wr.num_sge; ++i) {
          std::memmove(target, reinterpret_cast<const void*>(wr.sg_list[i].addr),
                       wr.sg_list[i].length);
          target += wr.sg_list[i].length;
        }
        stats.bytes_moved += total;
        if (wr.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
          ibv_wc wc{};
          wc.wr_id = peer->recvs.front().wr_id;
          peer->recvs.pop_front();
          wc.status = IBV_WC_SUCCESS;
          wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
          wc.wc_flags = IBV_WC_WITH_IMM;
          wc.imm_data = wr.imm_data;
          wc.byte_len = static_cast<std::uint32_t>(total);
          wc.qp_num = peer->qp.qp_num;
          wc.src_qp = qp->qp.qp_num;
          ++stats.recv_cqes;
          push(peer->recv_cq, wc);
        }
        return IBV_WC_SUCCESS;
      }
      case IBV_WR_RDMA_READ: {
        std::byte* source = check_remote(peer, wr.wr.rdma.rkey, wr.wr.rdma.remote_addr, total,
                                         IBV_ACCESS_REMOTE_READ);
        if (source == nullptr) {
          *remote_error = true;
          return IBV_WC_REM_ACCESS_ERR;
        }
        for (int i = 0; i < wr.num_sge; ++i) {
          std::memmove(reinterpret_cast<void*>(wr.sg_list[i].addr), source, wr.sg_list[i].length);
          source += wr.sg_list[i].length;
        }
        stats.bytes_moved += total;
        return IBV_WC_SUCCESS;
      }
      case IBV_WR_SEND:
      case IBV_WR_SEND_WITH_IMM: {
        if (peer->recvs.empty()) return IBV_WC_RNR_RETRY_EXC_ERR;
        FakeRecv recv = std::move(peer->recvs.front());
        peer->recvs.pop_front();
        ibv_wc wc{};
        wc.wr_id = recv.wr_id;
        wc.opcode = IBV_WC_RECV;
        wc.qp_num = peer->qp.qp_num;
        wc.src_qp = qp->qp.qp_num;
        const std::uint64_t room = sge_total(recv.sges.data(), static_cast<int>(recv.sges.size()));
        if (total > room || !check_local(recv.sges.data(), static_cast<int>(recv.sges.size()), true)) {
          wc.status = IBV_WC_LOC_LEN_ERR;
          ++stats.recv_cqes;
          push(peer->recv_cq, wc);
          *remote_error = true;
          return IBV_WC_REM_INV_REQ_ERR;
        }
        // Scatter the gathered payload into the receive SGEs.
        std::size_t recv_index = 0;
        std::uint64_t recv_used = 0;
        for (int i = 0; i < wr.num_sge; ++i) {
          auto* from = reinterpret_cast<const std::byte*>(wr.sg_list[i].addr);
          std::uint64_t left = wr.sg_list[i].length;
          while (left > 0) {
            const ibv_sge& to = recv.sges[recv_index];
            const std::uint64_t n = std::min<std::uint64_t>(left, to.length - recv_used);
            std::memmove(reinterpret_cast<std::byte*>(to.addr) + recv_used, from, n);
            from += n;
            left -= n;
            recv_used += n;
            if (recv_used == to.length) {
              ++recv_index;
              recv_used = 0;
            }
          }
        }
        stats.bytes_moved += total;
        wc.status = IBV_WC_SUCCESS;
        wc.byte_len = static_cast<std::uint32_t>(total);
        if (wr.opcode == IBV_WR_SEND_WITH_IMM) {
          wc.wc_flags = IBV_WC_WITH_IMM;
          wc.imm_data = wr.imm_data;
        }
        ++stats.recv_cqes;
        push(peer->recv_cq, wc);
        return IBV_WC_SUCCESS;
      }
      default:
        return IBV_WC_LOC_QP_OP_ERR;
    }
  }

  static ibv_wc_opcode wc_opcode(ibv_wr_opcode opcode) {
    switch (opcode) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
      case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
      default: return IBV_WC_SEND;
    }
  }

  void complete_send(FakeQp* qp, const ibv_send_wr& wr, ibv_wc_status status,
                     std::uint32_t byte_len) {
    const bool signaled = qp->sq_sig_all || (wr.send_flags & IBV_SEND_SIGNALED) != 0;
    if (status == IBV_WC_SUCCESS && !signaled) return;
    ibv_wc wc{};
    wc.wr_id = wr.wr_id;
    wc.status = status;
    wc.opcode = wc_opcode(wr.opcode);
    wc.byte_len = byte_len;
    wc.qp_num = qp->qp.qp_num;
    ++stats.send_cqes;
    push(qp->send_cq, wc);
  }
};

// ---- the table ----

ibv_device** fake_get_device_list(int* num_devices) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  const int count = nic.device_count;
  auto** list = new ibv_device*[static_cast<std::size_t>(count) + 1];
  for (int i = 0; i < count; ++i) list[i] = &nic.device.device;
  list[count] = nullptr;
  if (num_devices != nullptr) *num_devices = count;
  return list;
}

void fake_free_device_list(ibv_device** list) { delete[] list; }

const char* fake_get_device_name(ibv_device* device) { return device->name; }

ibv_context* fake_open_device(ibv_device* device) {
  auto* context = new FakeContext();
  context->context.device = device;
  return &context->context;
}

int fake_close_device(ibv_context* context) {
  delete fake_of<FakeContext>(context);
  return 0;
}

int fake_query_device(ibv_context*, ibv_device_attr* attr) {
  *attr = ibv_device_attr{};
  attr->max_mr_size = std::uint64_t{1} << 40;
  attr->max_qp = 1 << 16;
  attr->max_qp_wr = 16384;
  attr->max_sge = 30;
  attr->max_cq = 1 << 16;
  attr->max_cqe = 1 << 20;
  attr->max_mr = 1 << 20;
  attr->max_pd = 1 << 16;
  attr->max_qp_rd_atom = 16;
  attr->max_qp_init_rd_atom = 16;
  attr->phys_port_cnt = 1;
  return 0;
}

int fake_query_port(ibv_context*, std::uint8_t port_num, ibv_port_attr* attr) {
  if (port_num != 1) return EINVAL;
  *attr = ibv_port_attr{};
  attr->state = IBV_PORT_ACTIVE;
  attr->max_mtu = IBV_MTU_4096;
  attr->active_mtu = IBV_MTU_4096;
  attr->gid_tbl_len = 2;
  attr->lid = 0;
  attr->link_layer = IBV_LINK_LAYER_ETHERNET;
  return 0;
}

// Index 0: fe80::1 (link-local, RoCE v2), index 1: ::ffff:127.0.10.1 (RoCE v2). fe80::1 must be
// link-local (GID ranking puts it last); a GID is only ranked and exchanged, never connected to.
int fake_gid(int index, ibv_gid* gid) {
  *gid = ibv_gid{};
  if (index == 0) {
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    gid->raw[15] = 1;
    return 0;
  }
  if (index == 1) {
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    gid->raw[12] = 127;
    gid->raw[14] = 10;
    gid->raw[15] = 1;
    return 0;
  }
  return EINVAL;
}

int fake_query_gid(ibv_context*, std::uint8_t port_num, int index, ibv_gid* gid) {
  if (port_num != 1) return EINVAL;
  return fake_gid(index, gid);
}

int fake_query_gid_ex(ibv_context*, std::uint32_t port_num, std::uint32_t index,
                      ibv_gid_entry* entry) {
  if (port_num != 1) return EINVAL;
  *entry = ibv_gid_entry{};
  if (const int rc = fake_gid(static_cast<int>(index), &entry->gid); rc != 0) return rc;
  entry->gid_index = index;
  entry->port_num = port_num;
  entry->gid_type = IBV_GID_TYPE_ROCE_V2;
  return 0;
}

ibv_pd* fake_alloc_pd(ibv_context* context) {
  auto* pd = new FakePd();
  pd->pd.context = context;
  return &pd->pd;
}

int fake_dealloc_pd(ibv_pd* pd) {
  delete fake_of<FakePd>(pd);
  return 0;
}

ibv_mr* fake_reg_mr(ibv_pd* pd, void* addr, std::size_t length, int access) {
  // As the man page requires: remote write needs local write.
  if ((access & IBV_ACCESS_REMOTE_WRITE) != 0 && (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
    errno = EINVAL;
    return nullptr;
  }
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  auto* mr = new FakeMr();
  mr->access = access;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.lkey = nic.next_key;
  mr->mr.rkey = nic.next_key ^ 0x5a5a0000u;
  nic.next_key += 0x100;
  nic.by_lkey[mr->mr.lkey] = mr;
  nic.by_rkey[mr->mr.rkey] = mr;
  ++nic.stats.live_mrs;
  return &mr->mr;
}

int fake_dereg_mr(ibv_mr* verbs_mr) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  auto* mr = fake_of<FakeMr>(verbs_mr);
  nic.by_lkey.erase(mr->mr.lkey);
  nic.by_rkey.erase(mr->mr.rkey);
  --nic.stats.live_mrs;
  delete mr;
  return 0;
}

ibv_cq* fake_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                       int) {
  if (cqe < 1 || channel != nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new FakeCq();
  cq->cq.context = context;
  cq->cq.cq_context = cq_context;
  cq->cq.cqe = cqe;
  cq->capacity = static_cast<std::size_t>(cqe);
  return &cq->cq;
}

int fake_destroy_cq(ibv_cq* cq) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  delete fake_of<FakeCq>(cq);
  return 0;
}

ibv_qp* fake_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (attr->qp_type != IBV_QPT_RC || attr->send_cq == nullptr || attr->recv_cq == nullptr ||
      attr->cap.max_send_wr == 0 || attr->cap.max_send_sge == 0) {
    errno = EINVAL;
    return nullptr;
  }
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  auto* qp = new FakeQp();
  qp->qp.context = pd->context;
  qp->qp.pd = pd;
  qp->qp.send_cq = attr->send_cq;
  qp->qp.recv_cq = attr->recv_cq;
  qp->qp.qp_context = attr->qp_context;
  qp->qp.qp_type = IBV_QPT_RC;
  qp->qp.state = IBV_QPS_RESET;
  qp->qp.qp_num = nic.next_qpn++ & 0xffffff;
  qp->send_cq = fake_of<FakeCq>(attr->send_cq);
  qp->recv_cq = fake_of<FakeCq>(attr->recv_cq);
  qp->sq_sig_all = attr->sq_sig_all != 0;
  qp->max_send_sge = attr->cap.max_send_sge;
  qp->max_recv_wr = attr->cap.max_recv_wr;
  qp->max_recv_sge = attr->cap.max_recv_sge;
  nic.qps[qp->qp.qp_num] = qp;
  ++nic.stats.live_qps;
  return &qp->qp;
}

int fake_modify_qp(ibv_qp* verbs_qp, ibv_qp_attr* attr, int mask) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  FakeQp* qp = fake_of<FakeQp>(verbs_qp);
  if ((mask & IBV_QP_STATE) == 0) return EINVAL;
  const ibv_qp_state from = qp->qp.state;
  const ibv_qp_state to = attr->qp_state;
  auto has = [&](int bits) { return (mask & bits) == bits; };
  switch (to) {
    case IBV_QPS_INIT:
      if (from != IBV_QPS_RESET && from != IBV_QPS_INIT) return EINVAL;
      if (!has(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) || attr->port_num != 1) {
        return EINVAL;
      }
      qp->access = attr->qp_access_flags;
      break;
    case IBV_QPS_RTR:
      if (from != IBV_QPS_INIT) return EINVAL;
      if (!has(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        return EINVAL;
      }
      // RoCE needs a GRH.
      if (attr->ah_attr.is_global == 0) return EINVAL;
      qp->dest_qpn = attr->dest_qp_num;
      qp->rq_psn = attr->rq_psn;
      break;
    case IBV_QPS_RTS:
      if (from != IBV_QPS_RTR) return EINVAL;
      if (!has(IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC)) {
        return EINVAL;
      }
      qp->sq_psn = attr->sq_psn;
      break;
    case IBV_QPS_ERR:
      nic.to_error(qp);
      return 0;
    case IBV_QPS_RESET:
      qp->recvs.clear();
      break;
    default:
      return EINVAL;
  }
  qp->qp.state = to;
  return 0;
}

int fake_destroy_qp(ibv_qp* verbs_qp) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  FakeQp* qp = fake_of<FakeQp>(verbs_qp);
  nic.qps.erase(qp->qp.qp_num);
  --nic.stats.live_qps;
  delete qp;
  return 0;
}

int fake_post_send(ibv_qp* verbs_qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  FakeQp* qp = fake_of<FakeQp>(verbs_qp);
  if (qp->qp.state != IBV_QPS_RTS && qp->qp.state != IBV_QPS_ERR) {
    *bad_wr = wr;
    return EINVAL;
  }
  ++nic.stats.post_send_calls;
  for (; wr != nullptr; wr = wr->next) {
    ++nic.stats.send_wrs;
    if (qp->qp.state == IBV_QPS_ERR) {
      nic.complete_send(qp, *wr, IBV_WC_WR_FLUSH_ERR, 0);
      continue;
    }
    std::uint32_t byte_len = 0;
    bool remote_error = false;
    ibv_wc_status status;
    if (nic.fail_countdown > 0 && --nic.fail_countdown == 0) {
      status = nic.fail_status;
    } else {
      status = nic.execute(qp, *wr, &byte_len, &remote_error);
    }
    nic.complete_send(qp, *wr, status, byte_len);
    if (status != IBV_WC_SUCCESS) {
      nic.to_error(qp);
      if (remote_error) {
        auto peer = nic.qps.find(qp->dest_qpn);
        if (peer != nic.qps.end()) nic.to_error(peer->second);
      }
    }
  }
  return 0;
}

int fake_post_recv(ibv_qp* verbs_qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  FakeQp* qp = fake_of<FakeQp>(verbs_qp);
  if (qp->qp.state == IBV_QPS_RESET) {
    *bad_wr = wr;
    return EINVAL;
  }
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || static_cast<std::uint32_t>(wr->num_sge) > qp->max_recv_sge ||
        qp->recvs.size() >= qp->max_recv_wr) {
      *bad_wr = wr;
      return ENOMEM;
    }
    qp->recvs.push_back(FakeRecv{wr->wr_id, std::vector<ibv_sge>(wr->sg_list, wr->sg_list + wr->num_sge)});
    if (qp->qp.state == IBV_QPS_ERR) nic.flush_recvs(qp);
  }
  return 0;
}

int fake_poll_cq(ibv_cq* verbs_cq, int num_entries, ibv_wc* wc) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  FakeCq* cq = fake_of<FakeCq>(verbs_cq);
  int n = 0;
  while (n < num_entries && !cq->entries.empty()) {
    wc[n++] = cq->entries.front();
    cq->entries.pop_front();
  }
  return n;
}

const VerbsApi kFakeApi = [] {
  VerbsApi api;
  api.name = "fake";
  api.get_device_list = fake_get_device_list;
  api.free_device_list = fake_free_device_list;
  api.get_device_name = fake_get_device_name;
  api.open_device = fake_open_device;
  api.close_device = fake_close_device;
  api.query_device = fake_query_device;
  api.query_port = fake_query_port;
  api.query_gid = fake_query_gid;
  api.query_gid_ex = fake_query_gid_ex;
  api.alloc_pd = fake_alloc_pd;
  api.dealloc_pd = fake_dealloc_pd;
  api.reg_mr = fake_reg_mr;
  api.dereg_mr = fake_dereg_mr;
  api.create_cq = fake_create_cq;
  api.destroy_cq = fake_destroy_cq;
  api.create_qp = fake_create_qp;
  api.modify_qp = fake_modify_qp;
  api.destroy_qp = fake_destroy_qp;
  api.post_send = fake_post_send;
  api.post_recv = fake_post_recv;
  api.poll_cq = fake_poll_cq;
  return api;
}();

}  // namespace

const VerbsApi* fake_verbs_api() { return &kFakeApi; }

Status load_fake_verbs_api(const VerbsApi** out) {
  *out = &kFakeApi;
  return Status::ok();
}

FakeNic& FakeNic::instance() {
  static FakeNic nic;
  return nic;
}

FakeNicStats FakeNic::stats() const {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  return nic.stats;
}

void FakeNic::reset_stats() {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  const FakeNicStats live = nic.stats;
  nic.stats = FakeNicStats{};
  nic.stats.live_qps = live.live_qps;
  nic.stats.live_mrs = live.live_mrs;
}

void FakeNic::fail_nth_send_wr(std::uint64_t nth, ibv_wc_status status) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  nic.fail_countdown = nth;
  nic.fail_status = status;
}

bool FakeNic::flush_qp(std::uint32_t qpn) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  auto it = nic.qps.find(qpn);
  if (it == nic.qps.end()) return false;
  nic.to_error(it->second);
  return true;
}

std::vector<std::uint32_t> FakeNic::live_qpns() const {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  std::vector<std::uint32_t> out;
  for (const auto& [qpn, qp] : nic.qps) out.push_back(qpn);
  std::sort(out.begin(), out.end());
  return out;
}

void FakeNic::set_device_count(int count) {
  Nic& nic = Nic::get();
  std::lock_guard lock(nic.mu);
  nic.device_count = count < 0 ? 0 : count;
}

}  // namespace pdr::transfer::rdma
