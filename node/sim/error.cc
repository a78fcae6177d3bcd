#include "node/sim/error.h"

#include <nlohmann/json.hpp>

namespace pdr::node::sim {

std::string vllm_error_body(const SimError& error) {
  const char* type = error.status == 404   ? "NotFoundError"
                     : error.status >= 500 ? "InternalServerError"
                                           : "BadRequestError";
  return nlohmann::json{{"object", "error"},
                        {"message", error.message},
                        {"type", type},
                        {"param", nullptr},
                        {"code", error.status}}
      .dump();
}

}  // namespace pdr::node::sim
