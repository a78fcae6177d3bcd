#include "transfer/backend.h"

namespace pdr::transfer {

std::string_view backend_kind_label(BackendKind kind) {
  switch (kind) {
    case BackendKind::kTcp: return "tcp";
    case BackendKind::kShm: return "shm";
    case BackendKind::kRdma: return "rdma";
  }
  return "unknown";
}

proto::EndpointBackend endpoint_backend(BackendKind kind) {
  switch (kind) {
    case BackendKind::kTcp: return proto::EndpointBackend::kTcp;
    case BackendKind::kShm: return proto::EndpointBackend::kShm;
    case BackendKind::kRdma: return proto::EndpointBackend::kRdma;
  }
  return proto::EndpointBackend::kTcp;
}

}  // namespace pdr::transfer
