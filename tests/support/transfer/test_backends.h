// Builds backends for tests the way transfer/backend_factory.h builds them for the product, plus
// the test doubles the product cannot select: the RDMA backend over the in-process fake NIC
// (rdma/fake_verbs.h) and every backend wrapped in the fault-injecting FaultyBackend
// (faulty_backend.h). Part of pdr_transfer_test_support.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proto/base/status.h"
#include "transfer/backend.h"
#include "transfer/backend_factory.h"

namespace pdr::transfer {

struct TestBackendSettings {
  BackendSettings product;       // what make_backends() gets for the real backends
  bool rdma_fake_verbs = false;  // rdma over the fake NIC instead of libibverbs
  std::string faults;            // a FaultPlan (parse_fault_plan) wrapped around each; "": none
};

// As make_backends(), in order. kInvalidValue for a bad `faults` plan; kNotFound for rdma with
// rdma_fake_verbs in a build without the rdma backend.
Status make_test_backends(const std::vector<BackendKind>& kinds,
                          const TestBackendSettings& settings,
                          std::vector<std::unique_ptr<Backend>>* out);

}  // namespace pdr::transfer
