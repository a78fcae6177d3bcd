#include "transfer/backend_factory.h"

#include <algorithm>

#ifdef PDR_HAVE_TCP_BACKEND
#include "transfer/tcp/tcp_backend.h"
#endif
#ifdef PDR_HAVE_SHM_BACKEND
#include "transfer/shm/shm_backend.h"
#endif
#ifdef PDR_HAVE_RDMA_BACKEND
#include "transfer/rdma/rdma_backend.h"
#endif

namespace pdr::transfer {

namespace {

using Maker = std::unique_ptr<Backend> (*)(const BackendSettings&);

#ifdef PDR_HAVE_TCP_BACKEND
std::unique_ptr<Backend> make_tcp(const BackendSettings& settings) {
  TcpBackendOptions options;
  options.listen_host = settings.tcp_listen_host;
  options.advertise_host = settings.advertise_host;
  options.lanes = settings.tcp_lanes;
  return make_tcp_backend(options);
}
#endif
#ifdef PDR_HAVE_SHM_BACKEND
std::unique_ptr<Backend> make_shm(const BackendSettings&) {
  return make_shm_backend(ShmBackendOptions{});
}
#endif
#ifdef PDR_HAVE_RDMA_BACKEND
std::unique_ptr<Backend> make_rdma(const BackendSettings& settings) {
  RdmaBackendOptions options;
  options.device = settings.rdma_device;
  options.listen_host = settings.tcp_listen_host;
  return make_rdma_backend(options, &rdma::load_verbs_api);
}
#endif

// The backends this build contains; nullptr for one it does not.
Maker maker(BackendKind kind) {
  switch (kind) {
#ifdef PDR_HAVE_TCP_BACKEND
    case BackendKind::kTcp: return &make_tcp;
#endif
#ifdef PDR_HAVE_SHM_BACKEND
    case BackendKind::kShm: return &make_shm;
#endif
#ifdef PDR_HAVE_RDMA_BACKEND
    case BackendKind::kRdma: return &make_rdma;
#endif
    default: return nullptr;
  }
}

}  // namespace

Status parse_backend_list(std::string_view list, std::vector<BackendKind>* out) {
  out->clear();
  if (list.empty()) return Status(StatusCode::kInvalidValue, "the backend list is empty");
  while (true) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    BackendKind kind = BackendKind::kTcp;
    bool known = false;
    for (BackendKind k : {BackendKind::kTcp, BackendKind::kShm, BackendKind::kRdma}) {
      if (name == backend_kind_label(k)) {
        kind = k;
        known = true;
      }
    }
    if (!known) {
      return Status(StatusCode::kInvalidValue,
                    "transfer backend '" + std::string(name) + "' is not tcp, shm or rdma");
    }
    if (std::find(out->begin(), out->end(), kind) != out->end()) {
      return Status(StatusCode::kInvalidValue,
                    "transfer backend '" + std::string(name) + "' is listed twice");
    }
    if (maker(kind) == nullptr) {
      return Status(StatusCode::kNotFound,
                    "transfer backend '" + std::string(name) + "' is not part of this build");
    }
    out->push_back(kind);
    if (comma == std::string_view::npos) return Status::ok();
    list = list.substr(comma + 1);
  }
}

Status make_backends(const std::vector<BackendKind>& kinds, const BackendSettings& settings,
                     std::vector<std::unique_ptr<Backend>>* out) {
  out->clear();
  for (BackendKind kind : kinds) {
    const Maker make = maker(kind);
    if (make == nullptr) {
      return Status(StatusCode::kNotFound, "transfer backend '" +
                                               std::string(backend_kind_label(kind)) +
                                               "' is not part of this build");
    }
    out->push_back(make(settings));
  }
  return Status::ok();
}

}  // namespace pdr::transfer
