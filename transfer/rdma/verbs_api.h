// VerbsApi: the verbs calls the RDMA backend makes, as a table of function pointers (docs/design/kv-transfer.md
// The backend is handed a VerbsLoader that yields the table (make_rdma_backend()):
//   load_verbs_api()       - the real libibverbs.so.1, dlopen'd at run time (verbs_loader.cc), so
//                            the binary neither links nor needs RDMA userspace; what every product
//                            caller passes;
//   load_fake_verbs_api()  - an in-process fake NIC, only in the test-support library
//                            (tests/support/transfer/rdma/fake_verbs.h).
// The backend never calls an ibv_* function or a static-inline verbs helper directly: everything
// goes through the table, which is the seam that lets the whole data path run on CI.
//
// Signatures are those of the verbs.h functions of the same name (rdma-core 44). post_send,
// post_recv and poll_cq are static inline in verbs.h (they dispatch through the context's ops), so
// the real table points at small wrappers. query_gid_ex is optional (nullptr when the library
// lacks _ibv_query_gid_ex); then the GID type and netdev are unknown and the ranking (gid_rank.h)
// sees IBV_GID_TYPE_IB-less candidates with type kUnknown.
//
// Objects returned by one table must only be passed back to the same table.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "proto/base/status.h"

namespace pdr::transfer::rdma {

struct VerbsApi {
  const char* name = "";  // "libibverbs" or "fake", for logs and messages

  ibv_device** (*get_device_list)(int* num_devices) = nullptr;
  void (*free_device_list)(ibv_device** list) = nullptr;
  const char* (*get_device_name)(ibv_device* device) = nullptr;
  ibv_context* (*open_device)(ibv_device* device) = nullptr;
  int (*close_device)(ibv_context* context) = nullptr;
  int (*query_device)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*query_port)(ibv_context* context, std::uint8_t port_num, ibv_port_attr* attr) = nullptr;
  int (*query_gid)(ibv_context* context, std::uint8_t port_num, int index, ibv_gid* gid) = nullptr;
  int (*query_gid_ex)(ibv_context* context, std::uint32_t port_num, std::uint32_t index,
                      ibv_gid_entry* entry) = nullptr;  // optional
  ibv_pd* (*alloc_pd)(ibv_context* context) = nullptr;
  int (*dealloc_pd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*reg_mr)(ibv_pd* pd, void* addr, std::size_t length, int access) = nullptr;
  int (*dereg_mr)(ibv_mr* mr) = nullptr;
  ibv_cq* (*create_cq)(ibv_context* context, int cqe, void* cq_context,
                       ibv_comp_channel* channel, int comp_vector) = nullptr;
  int (*destroy_cq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*create_qp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modify_qp)(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) = nullptr;
  int (*destroy_qp)(ibv_qp* qp) = nullptr;
  int (*post_send)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) = nullptr;
  int (*post_recv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) = nullptr;
  int (*poll_cq)(ibv_cq* cq, int num_entries, ibv_wc* wc) = nullptr;
};

// The real library. Loads libibverbs.so.1 once per process (the handle is never closed: providers
// keep global state) and checks that at least one device exists. Errors (kIoError):
//   "rdma unavailable: libibverbs.so.1 not found (<dlerror>)"
//   "rdma unavailable: libibverbs.so.1 lacks ibv_reg_mr"
//   "rdma unavailable: no RDMA device found"
// Thread-safe. On success *out points at a table that lives for the rest of the process.
Status load_verbs_api(const VerbsApi** out);

// How the backend gets its table: called once from start(); on error the backend does not start
// and reports the status (the engine then leaves it out). On success *out must outlive the backend.
using VerbsLoader = Status (*)(const VerbsApi** out);

// Human-readable name of a work-completion status, e.g. "IBV_WC_REM_ACCESS_ERR".
const char* wc_status_name(ibv_wc_status status);

}  // namespace pdr::transfer::rdma
