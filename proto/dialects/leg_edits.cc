#include "proto/dialects/leg_edits.h"

#include <optional>

namespace pdr::proto::dialects {

std::string bracket_host(std::string_view host) {
  if (host.find(':') != std::string_view::npos) return "[" + std::string(host) + "]";
  return std::string(host);
}

void apply_prefill_edits(JsonObjectBody* body) {
  body->set_raw("stream", "false");
  body->set_raw("max_tokens", "1");
  if (body->has("max_completion_tokens")) body->set_raw("max_completion_tokens", "1");
  body->remove("stream_options");
  body->remove("min_tokens");
  body->remove("min_completion_tokens");
}

// docs/design/wire-formats.md 1.3 step 6. vLLM rejects max_tokens < 1, and at 1 the client asked for a single
// token, which the decode still produces.
void decrement_decode_tokens(JsonObjectBody* body) {
  for (std::string_view key : {"max_completion_tokens", "max_tokens"}) {
    if (!body->has(key) || body->is_null(key)) continue;
    std::optional<int64_t> v;
    if (!body->get_int(key, &v) || !v) continue;  // validated by build_legs
    if (*v > 1) body->set_raw(key, json_int(*v - 1));
    return;
  }
}

void drop_kv_transfer_params(JsonObjectBody* decode) { decode->remove("kv_transfer_params"); }

}  // namespace pdr::proto::dialects
