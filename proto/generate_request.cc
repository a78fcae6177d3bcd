#include "proto/generate_request.h"

#include <optional>
#include <string>

namespace pdr::proto {
namespace {

// The token counts vLLM reads from sampling_params that the dialects edit at the top level
// (apply_prefill_edits, decrement_decode_tokens).
constexpr std::string_view kTokenCounts[] = {"max_tokens", "min_tokens"};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool is_null_raw(std::optional<std::string_view> raw) { return !raw || *raw == "null"; }

// At most 24 bytes of a value, for messages.
std::string excerpt(std::string_view raw) {
  return raw.size() <= 24 ? std::string(raw) : std::string(raw.substr(0, 24)) + "...";
}

// `raw` is validated JSON. OK when it is an array of 1..kMaxGenerateTokenIds integers in [0, 2^32).
Status check_token_ids(std::string_view raw) {
  if (raw.empty() || raw.front() != '[') {
    return Status(StatusCode::kWrongType, "token_ids must be an array of token ids (integers), got " + excerpt(raw));
  }
  size_t i = 1, count = 0;
  auto skip_space = [&] {
    while (i < raw.size() && is_space(raw[i])) ++i;
  };
  skip_space();
  if (i < raw.size() && raw[i] == ']') return Status(StatusCode::kInvalidValue, "token_ids must not be empty");
  while (i < raw.size()) {
    skip_space();
    const size_t start = i;
    uint64_t value = 0;
    bool fits = true;
    while (i < raw.size() && raw[i] >= '0' && raw[i] <= '9') {
      value = value * 10 + static_cast<uint64_t>(raw[i] - '0');
      if (value > UINT32_MAX) {
        fits = false;
        value = UINT32_MAX;
      }
      ++i;
    }
    const size_t digits_end = i;
    skip_space();
    const bool integer = digits_end > start && i < raw.size() && (raw[i] == ',' || raw[i] == ']');
    if (!integer || !fits) {
      size_t end = start;
      while (end < raw.size() && raw[end] != ',' && raw[end] != ']') ++end;
      return Status(fits ? StatusCode::kWrongType : StatusCode::kOutOfRange,
                    "token_ids[" + std::to_string(count) + "] must be a non-negative integer below 2^32, got " +
                        excerpt(raw.substr(start, end - start)));
    }
    if (++count > kMaxGenerateTokenIds) {
      return Status(StatusCode::kTooLarge,
                    "token_ids has more than " + std::to_string(kMaxGenerateTokenIds) + " ids");
    }
    if (raw[i] == ']') return Status::ok();
    ++i;  // ','
  }
  return Status(StatusCode::kMalformed, "token_ids is not a complete array");  // validated JSON: unreachable
}

Status prefixed(const Status& st, std::string_view prefix) {
  if (st.is_ok()) return st;
  return Status(st.code(), std::string(prefix) + st.message());
}

// An optional member that must be an object or null.
Status check_object_or_null(std::optional<std::string_view> raw, std::string_view name) {
  if (is_null_raw(raw) || raw->front() == '{') return Status::ok();
  return Status(StatusCode::kWrongType, std::string(name) + " must be an object, got " + excerpt(*raw));
}

Status check_sampling_params(const JsonObjectBody& sp, const JsonLimits& limits, int64_t* choices) {
  for (std::string_view key : {"max_tokens", "min_tokens", "n"}) {
    if (!sp.has(key) || sp.is_null(key)) continue;
    std::optional<int64_t> v;
    if (Status st = sp.get_int(key, &v); !st) return prefixed(st, "sampling_params.");
    const int64_t least = key == "min_tokens" ? 0 : 1;
    if (*v < least) {
      return Status(StatusCode::kOutOfRange, "sampling_params." + std::string(key) + " must be at least " +
                                                 std::to_string(least) + ", got " + std::to_string(*v));
    }
    if (key == "n") *choices = *v;
  }
  const auto extra = sp.get_raw("extra_args");
  if (Status st = check_object_or_null(extra, "sampling_params.extra_args"); !st) return st;
  if (is_null_raw(extra)) return Status::ok();
  JsonObjectBody extra_args;
  if (Status st = JsonObjectBody::parse_member_borrowed(*extra, limits, &extra_args); !st) {
    return prefixed(st, "sampling_params.extra_args: ");
  }
  return check_object_or_null(extra_args.get_raw("kv_transfer_params"),
                              "sampling_params.extra_args.kv_transfer_params");
}

// sampling_params of `body` parsed (borrowing its bytes: `body` must not be edited meanwhile).
Status sampling_params_of(const JsonObjectBody& body, const JsonLimits& limits, JsonObjectBody* out) {
  const auto raw = body.get_raw("sampling_params");
  if (is_null_raw(raw)) return Status(StatusCode::kMissingKey, "sampling_params is required (an object)");
  if (raw->front() != '{') {
    return Status(StatusCode::kWrongType, "sampling_params must be an object, got " + excerpt(*raw));
  }
  return prefixed(JsonObjectBody::parse_member_borrowed(*raw, limits, out), "sampling_params: ");
}

}  // namespace

Status check_generate_request(const JsonObjectBody& body, const JsonLimits& limits, int64_t* choices) {
  *choices = 1;
  const auto token_ids = body.get_raw("token_ids");
  if (is_null_raw(token_ids)) return Status(StatusCode::kMissingKey, "token_ids is required (an array of token ids)");
  if (Status st = check_token_ids(*token_ids); !st) return st;
  JsonObjectBody sp;
  if (Status st = sampling_params_of(body, limits, &sp); !st) return st;
  if (Status st = check_sampling_params(sp, limits, choices); !st) return st;
  if (const auto model = body.get_raw("model"); !is_null_raw(model) && model->front() != '"') {
    return Status(StatusCode::kWrongType, "model must be a string, got " + excerpt(*model));
  }
  if (const auto stream = body.get_raw("stream"); !is_null_raw(stream) && *stream != "true" && *stream != "false") {
    return Status(StatusCode::kWrongType, "stream must be a boolean, got " + excerpt(*stream));
  }
  return check_object_or_null(body.get_raw("kv_transfer_params"), "kv_transfer_params");
}

std::string_view generate_token_ids(const JsonObjectBody& body) {
  return body.get_raw("token_ids").value_or(std::string_view());
}

Status generate_leg_view(const JsonObjectBody& client, const JsonLimits& limits, JsonObjectBody* leg) {
  JsonObjectBody sp;
  if (Status st = sampling_params_of(client, limits, &sp); !st) return st;
  for (std::string_view key : kTokenCounts) {
    if (const auto value = sp.get_raw(key)) {
      leg->set_raw(key, *value);
    } else {
      leg->remove(key);
    }
  }
  return Status::ok();
}

Status finish_generate_leg(const JsonObjectBody& client, const JsonLimits& limits, JsonObjectBody* leg) {
  JsonObjectBody sp;
  if (Status st = sampling_params_of(client, limits, &sp); !st) return st;
  for (std::string_view key : kTokenCounts) {
    if (const auto value = leg->get_raw(key)) {
      sp.set_raw(key, *value);
    } else {
      sp.remove(key);
    }
    if (const auto original = client.get_raw(key)) {
      leg->set_raw(key, *original);
    } else {
      leg->remove(key);
    }
  }
  leg->set_raw("sampling_params", sp.render());
  return mirror_generate_kv_params(limits, leg);
}

Status mirror_generate_kv_params(const JsonLimits& limits, JsonObjectBody* leg) {
  std::string rendered;
  {
    JsonObjectBody sp;
    if (Status st = sampling_params_of(*leg, limits, &sp); !st) return st;
    const auto params = leg->get_raw("kv_transfer_params");
    const auto extra = sp.get_raw("extra_args");
    if (is_null_raw(extra)) {
      if (is_null_raw(params)) return Status::ok();  // nothing to mirror, nothing to remove
      std::string extra_args = JsonObjectWriter().raw("kv_transfer_params", *params).finish();
      sp.set_raw("extra_args", extra_args);
    } else {
      JsonObjectBody extra_args;
      if (Status st = JsonObjectBody::parse_member_borrowed(*extra, limits, &extra_args); !st) {
        return prefixed(st, "sampling_params.extra_args: ");
      }
      if (is_null_raw(params)) {
        if (!extra_args.has("kv_transfer_params")) return Status::ok();
        extra_args.remove("kv_transfer_params");
      } else {
        extra_args.set_raw("kv_transfer_params", *params);
      }
      sp.set_raw("extra_args", extra_args.render());
    }
    rendered = sp.render();
  }
  leg->set_raw("sampling_params", rendered);
  return Status::ok();
}

}  // namespace pdr::proto
