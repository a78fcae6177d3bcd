#include "proto/responses_legs.h"

#include <optional>

namespace pdr::proto {

Status check_responses_fields(const JsonObjectBody& client) {
  if (!client.has("max_output_tokens") || client.is_null("max_output_tokens")) return Status::ok();
  std::optional<int64_t> v;
  return client.get_int("max_output_tokens", &v);
}

void respell_prefill_for_responses(const JsonObjectBody& client, JsonObjectBody* prefill) {
  // The dialects cap the prefill with max_tokens: 1. Where the prefill's max_tokens is the
  // client's own (SGLang sends the client's body to both legs), nothing was capped.
  const std::optional<std::string_view> capped = prefill->get_raw("max_tokens");
  if (!capped) return;
  const std::optional<std::string_view> asked = client.get_raw("max_tokens");
  if (asked && *asked == *capped && *capped != "1") return;
  prefill->remove("max_tokens");
  prefill->remove("max_completion_tokens");
  prefill->set_raw("max_output_tokens", "1");
  prefill->set_raw("store", "false");
  prefill->remove("background");
}

}  // namespace pdr::proto
