// Device: the RDMA device one backend opened, the state that lives from the backend's start() to
// its stop(): the verbs table the injected loader yielded (rdma_backend.h), the device context, one
// protection domain, one completion queue, and the facts of port 1 that every connection's QP
// transitions and handshake record carry (qp_attrs.h LocalPath, the GID chosen by gid_rank.h, the
// LID, the GID type) plus the device's MR size limit.
//
// open() loads verbs, opens options.device (or the first device), queries the device and port 1,
// ranks the port's GID table unless options.gid_index names an entry, then allocates the PD
// and a CQ of options.cq_depth entries with no completion channel (the I/O thread polls, R-12 is
// future work). Every failure is kIoError "rdma unavailable: ..." (kInvalidValue without a loader),
// so the engine leaves the backend out; a failed open() has released what it had opened.
//
// Ownership and threads: State (backend_state.h) owns one Device. open() and close() run in the
// backend's start() and stop() with the backend lock held; between them the facts are read-only
// and the verbs objects are used by whichever thread holds that lock. close() requires every QP and
// MR made from the PD to be gone already (the backend destroys its connections and region MRs
// first); the verbs table stays valid after close() (loaders hand out tables that outlive the
// backend).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "proto/base/status.h"
#include "transfer/rdma/qp_attrs.h"
#include "transfer/rdma/rdma_backend.h"
#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer::rdma {

class Device {
 public:
  Device() = default;
  ~Device() { close(); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  // Reads options.device, options.gid_index and options.cq_depth.
  Status open(const RdmaBackendOptions& options, VerbsLoader load_verbs);
  // Destroys the CQ, the PD and the context (each only if open). Idempotent.
  void close();

  const VerbsApi& api() const { return *api_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  const LocalPath& path() const { return path_; }
  const std::array<std::uint8_t, 16>& gid() const { return gid_; }
  std::uint16_t lid() const { return lid_; }
  std::uint8_t gid_type() const { return gid_type_; }  // 0 IB, 1 RoCE v1, 2 RoCE v2
  std::uint64_t max_mr_size() const { return max_mr_size_; }

 private:
  // Fills path_.sgid_index, gid_ and gid_type_ from port 1's GID table.
  Status choose_gid(const RdmaBackendOptions& options, int gid_table_length, const char* name);

  const VerbsApi* api_ = nullptr;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  LocalPath path_;
  std::array<std::uint8_t, 16> gid_{};
  std::uint16_t lid_ = 0;
  std::uint8_t gid_type_ = 0;
  std::uint64_t max_mr_size_ = 0;
};

}  // namespace pdr::transfer::rdma
