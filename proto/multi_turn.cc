#include "proto/multi_turn.h"

#include "proto/address.h"
#include "proto/quoted_text.h"

namespace pdr::proto {

std::optional<std::string_view> kv_transfer_params_of(std::string_view json_object, const JsonLimits& limits) {
  JsonObjectBody body;
  if (!JsonObjectBody::parse_borrowed(json_object, limits, &body).is_ok()) return std::nullopt;
  std::optional<std::string_view> raw = body.get_raw("kv_transfer_params");
  if (!raw || raw->empty() || raw->front() != '{') return std::nullopt;
  // A member of a document validated just above: indexed, not validated again.
  JsonObjectBody params;
  if (!JsonObjectBody::parse_member_borrowed(*raw, limits, &params).is_ok() || params.size() == 0) {
    return std::nullopt;
  }
  return raw;
}

Status next_turn_prefill_params(std::string_view decode_params, std::string_view decode_host,
                                const JsonLimits& limits, std::string* out) {
  JsonObjectBody params;
  Status st = JsonObjectBody::parse_borrowed(decode_params, limits, &params);
  if (!st.is_ok()) return st;
  for (std::string_view key : {"remote_block_ids", "remote_engine_id"}) {
    if (!params.has(key) || params.is_null(key)) {
      return Status(StatusCode::kMissingKey,
                    "the decode's kv_transfer_params have no " + std::string(key) + ": nothing to reuse");
    }
  }
  // The decode's own word for its side channel is kept (check_next_turn_remote_host judges it
  // when the next turn is paired); none: its registered host, as vLLM's multi-turn proxy sets.
  std::optional<std::string> named;
  if (!params.is_null("remote_host")) {
    if (Status st = params.get_string("remote_host", &named); !st) return st;
  }
  params.set_raw("do_remote_decode", "true");
  params.set_raw("do_remote_prefill", "false");
  if (!named) params.set_raw("remote_host", json_string(decode_host));
  *out = params.render();
  return Status::ok();
}

Status check_next_turn_remote_host(std::string_view prefill_params, std::string_view decode_host,
                                   std::string_view prefill_host, const JsonLimits& limits) {
  JsonObjectBody params;
  if (Status st = JsonObjectBody::parse_borrowed(prefill_params, limits, &params); !st) return st;
  std::optional<std::string> host;
  if (!params.is_null("remote_host")) {
    if (Status st = params.get_string("remote_host", &host); !st) return st;
  }
  if (!host) return Status(StatusCode::kWrongType, "the decode's kv_transfer_params name no remote_host");
  if (side_channel_host_ok(*host, decode_host, prefill_host)) return Status::ok();
  return Status(StatusCode::kRejected, "the decode's kv_transfer_params name remote_host " + quote_untrusted(*host) +
                                           ", not the decode's own host " + quote_untrusted(decode_host));
}

}  // namespace pdr::proto
