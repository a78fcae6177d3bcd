#include "tests/support/transfer/test_backends.h"

#include <utility>

#include "tests/support/transfer/faulty_backend.h"
#ifdef PDR_HAVE_RDMA_BACKEND
#include "tests/support/transfer/rdma/fake_verbs.h"
#include "transfer/rdma/rdma_backend.h"
#endif

namespace pdr::transfer {

namespace {

Status make_one(BackendKind kind, const TestBackendSettings& settings,
                std::unique_ptr<Backend>* out) {
  if (kind == BackendKind::kRdma && settings.rdma_fake_verbs) {
#ifdef PDR_HAVE_RDMA_BACKEND
    // The same options backend_factory.cc derives from BackendSettings.
    RdmaBackendOptions options;
    options.device = settings.product.rdma_device;
    options.listen_host = settings.product.tcp_listen_host;
    *out = make_rdma_backend(options, &rdma::load_fake_verbs_api);
    return Status::ok();
#else
    return Status(StatusCode::kNotFound, "transfer backend 'rdma' is not part of this build");
#endif
  }
  std::vector<std::unique_ptr<Backend>> one;
  if (Status s = make_backends({kind}, settings.product, &one); !s) return s;
  *out = std::move(one.front());
  return Status::ok();
}

}  // namespace

Status make_test_backends(const std::vector<BackendKind>& kinds,
                          const TestBackendSettings& settings,
                          std::vector<std::unique_ptr<Backend>>* out) {
  FaultPlan faults;
  if (Status s = parse_fault_plan(settings.faults, &faults); !s) return s;
  out->clear();
  for (BackendKind kind : kinds) {
    std::unique_ptr<Backend> backend;
    if (Status s = make_one(kind, settings, &backend); !s) return s;
    if (!settings.faults.empty()) backend = make_faulty_backend(std::move(backend), faults);
    out->push_back(std::move(backend));
  }
  return Status::ok();
}

}  // namespace pdr::transfer
