#include "transfer/backend_factory.h"

namespace pdr::transfer {

Status parse_backend_list(std::string_view list, std::vector<BackendKind>* out) {
  out->clear();
  (void)list;
  return Status(StatusCode::kNotFound, "no transfer backend is built yet");
}

Status make_backends(const std::vector<BackendKind>& kinds, const BackendSettings& settings,
                     std::vector<std::unique_ptr<Backend>>* out) {
  (void)kinds;
  (void)settings;
  out->clear();
  return Status(StatusCode::kNotFound, "no transfer backend is built yet");
}

}  // namespace pdr::transfer
