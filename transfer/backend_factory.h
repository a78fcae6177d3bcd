// Picks and builds backends by name, for the command-line tools (pdnode sim, pdnode xfer-bench)
// and the examples: "--transfer-backends shm,tcp" -> the engine's preference order. Only real
// backends: the test doubles (fake verbs NIC, fault-injecting wrapper) are built by the tests'
// own make_test_backends() (tests/support/transfer/test_backends.h).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "transfer/backend.h"

namespace pdr::transfer {

struct BackendSettings {
  std::string tcp_listen_host = "127.0.0.1";  // the tcp backend's listen address (port 0: any)
  std::string advertise_host;                 // published in the descriptor; default listen host
  std::uint32_t tcp_lanes = 0;                // 0: min(4, cores)
  std::string rdma_device;                    // empty: the first device
};

// "tcp", "shm,tcp", "rdma,shm,tcp" (order = preference). kInvalidValue names an unknown or repeated
// backend, kNotFound one this build does not contain.
Status parse_backend_list(std::string_view list, std::vector<BackendKind>* out);

// Builds them in order (rdma over the real libibverbs). Backends are not started here
// (Engine::create starts them and skips, with the reason, one that cannot start).
Status make_backends(const std::vector<BackendKind>& kinds, const BackendSettings& settings,
                     std::vector<std::unique_ptr<Backend>>* out);

}  // namespace pdr::transfer
