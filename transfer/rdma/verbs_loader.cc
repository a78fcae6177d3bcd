// The real verbs table: dlopen("libibverbs.so.1") + dlsym (contract: verbs_api.h). We never link
// libibverbs (docs/design/kv-transfer.md R-1), so this file must not reference an ibv_* symbol: verbs.h macros
// such as ibv_reg_mr() and ibv_query_port() expand to inline code that calls exported symbols,
// hence every exported function is reached through a dlsym'd pointer of our own type.
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer::rdma {

namespace {

// post_send/post_recv/poll_cq are static inline in verbs.h: they only dispatch through the ops
// table the provider installed in the context, so they reference no library symbol.
int real_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  return qp->context->ops.post_send(qp, wr, bad_wr);
}
int real_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  return qp->context->ops.post_recv(qp, wr, bad_wr);
}
int real_poll_cq(ibv_cq* cq, int num_entries, ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, num_entries, wc);
}

using QueryGidExFn = int (*)(ibv_context*, std::uint32_t, std::uint32_t, ibv_gid_entry*,
                             std::uint32_t, std::size_t);
QueryGidExFn g_query_gid_ex = nullptr;

int real_query_gid_ex(ibv_context* context, std::uint32_t port_num, std::uint32_t index,
                      ibv_gid_entry* entry) {
  return g_query_gid_ex(context, port_num, index, entry, 0, sizeof(*entry));
}

// ibv_query_port's exported symbol takes the compat struct but hands the pointer to the provider as
// a full ibv_port_attr (rdma-core verbs.c), so passing a zeroed full struct is what the inline
// ___ibv_query_port does too.
using QueryPortFn = int (*)(ibv_context*, std::uint8_t, ibv_port_attr*);
QueryPortFn g_query_port = nullptr;
int real_query_port(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr) {
  *attr = ibv_port_attr{};
  return g_query_port(context, port_num, attr);
}

template <typename Fn>
bool bind(void* handle, const char* symbol, Fn* out) {
  void* address = dlsym(handle, symbol);
  if (address == nullptr) return false;
  *out = reinterpret_cast<Fn>(address);
  return true;
}

struct Loaded {
  Status status;
  VerbsApi api;
};

Loaded load_once() {
  Loaded loaded;
  void* handle = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    loaded.status = Status(StatusCode::kIoError,
                           std::string("rdma unavailable: libibverbs.so.1 not found (") +
                               (error != nullptr ? error : "dlopen failed") + ")");
    return loaded;
  }
  VerbsApi& api = loaded.api;
  api.name = "libibverbs";
  const char* missing = nullptr;
  auto need = [&](const char* symbol, auto* out) {
    if (missing == nullptr && !bind(handle, symbol, out)) missing = symbol;
  };
  need("ibv_get_device_list", &api.get_device_list);
  need("ibv_free_device_list", &api.free_device_list);
  need("ibv_get_device_name", &api.get_device_name);
  need("ibv_open_device", &api.open_device);
  need("ibv_close_device", &api.close_device);
  need("ibv_query_device", &api.query_device);
  need("ibv_query_port", &g_query_port);
  need("ibv_query_gid", &api.query_gid);
  need("ibv_alloc_pd", &api.alloc_pd);
  need("ibv_dealloc_pd", &api.dealloc_pd);
  need("ibv_reg_mr", &api.reg_mr);
  need("ibv_dereg_mr", &api.dereg_mr);
  need("ibv_create_cq", &api.create_cq);
  need("ibv_destroy_cq", &api.destroy_cq);
  need("ibv_create_qp", &api.create_qp);
  need("ibv_modify_qp", &api.modify_qp);
  need("ibv_destroy_qp", &api.destroy_qp);
  if (missing != nullptr) {
    loaded.status = Status(StatusCode::kIoError,
                           std::string("rdma unavailable: libibverbs.so.1 lacks ") + missing);
    return loaded;
  }
  api.query_port = real_query_port;
  if (bind(handle, "_ibv_query_gid_ex", &g_query_gid_ex)) api.query_gid_ex = real_query_gid_ex;
  api.post_send = real_post_send;
  api.post_recv = real_post_recv;
  api.poll_cq = real_poll_cq;
  return loaded;
}

}  // namespace

Status load_verbs_api(const VerbsApi** out) {
  static const Loaded loaded = load_once();  // thread-safe static init; the library stays loaded
  if (!loaded.status) return loaded.status;
  int count = 0;
  ibv_device** list = loaded.api.get_device_list(&count);
  if (list != nullptr) loaded.api.free_device_list(list);
  if (list == nullptr || count <= 0) {
    return Status(StatusCode::kIoError, "rdma unavailable: no RDMA device found");
  }
  *out = &loaded.api;
  return Status::ok();
}

const char* wc_status_name(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "IBV_WC_SUCCESS";
    case IBV_WC_LOC_LEN_ERR: return "IBV_WC_LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR: return "IBV_WC_LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR: return "IBV_WC_LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR: return "IBV_WC_WR_FLUSH_ERR";
    case IBV_WC_REM_INV_REQ_ERR: return "IBV_WC_REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR: return "IBV_WC_REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR: return "IBV_WC_REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR: return "IBV_WC_RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "IBV_WC_RNR_RETRY_EXC_ERR";
    case IBV_WC_FATAL_ERR: return "IBV_WC_FATAL_ERR";
    case IBV_WC_GENERAL_ERR: return "IBV_WC_GENERAL_ERR";
    default: return "IBV_WC_OTHER_ERR";
  }
}

}  // namespace pdr::transfer::rdma
