// SimError: how the simulated vLLM node refuses a request. Every refusal carries the HTTP status,
// a short reason label (counted per label in GET /sim/requests) and the human message that goes
// into vLLM's error body.
#pragma once

#include <string>

namespace pdr::node::sim {

struct SimError {
  int status = 400;
  std::string reason;   // "bad_json", "missing_transfer_id", "bad_dp_rank", ...
  std::string message;
};

// vLLM's ErrorResponse as its OpenAI server serialises it:
// {"object":"error","message":...,"type":"BadRequestError","param":null,"code":400}.
std::string vllm_error_body(const SimError& error);

}  // namespace pdr::node::sim
