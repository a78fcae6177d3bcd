#include "proto/multi_turn.h"

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
  params.set_raw("do_remote_decode", "true");
  params.set_raw("do_remote_prefill", "false");
  params.set_raw("remote_host", json_string(decode_host));
  *out = params.render();
  return Status::ok();
}

}  // namespace pdr::proto
