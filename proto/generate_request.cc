#include "proto/generate_request.h"

#include <optional>
#include <string>

#include "proto/request_checks.h"

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

// Checks the indexed sampling_params `view->sampling_params` and indexes its extra_args into
// `view`.
Status check_sampling_params(const JsonLimits& limits, GenerateView* view) {
  const JsonObjectBody& sp = view->sampling_params;
  for (std::string_view key : {"max_tokens", "min_tokens", "n"}) {
    if (!sp.has(key) || sp.is_null(key)) continue;
    std::optional<int64_t> v;
    if (Status st = sp.get_int(key, &v); !st) return prefixed(st, "sampling_params.");
    const int64_t least = key == "min_tokens" ? 0 : 1;
    if (*v < least) {
      return Status(StatusCode::kOutOfRange, "sampling_params." + std::string(key) + " must be at least " +
                                                 std::to_string(least) + ", got " + std::to_string(*v));
    }
    // The token counts' upper bound is the OpenAI endpoints' (request_checks.h).
    if (key != "n" && *v > kMaxTokenCount) {
      return Status(StatusCode::kOutOfRange, "sampling_params." + std::string(key) + " must be at most " +
                                                 std::to_string(kMaxTokenCount) + ", got " + std::to_string(*v));
    }
    if (key == "n") view->choices = *v;
  }
  const auto extra = sp.get_raw("extra_args");
  if (Status st = check_object_or_null(extra, "sampling_params.extra_args"); !st) return st;
  if (is_null_raw(extra)) return Status::ok();
  if (Status st = JsonObjectBody::parse_member_borrowed(*extra, limits, &view->extra_args); !st) {
    return prefixed(st, "sampling_params.extra_args: ");
  }
  view->has_extra_args = true;
  return check_object_or_null(view->extra_args.get_raw("kv_transfer_params"),
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

// Mirrors `params` (a leg's top-level kv_transfer_params) into `sp`, a leg's sampling_params whose
// extra_args is indexed in `extra_args` (null when absent or null). True when `sp` changed.
bool mirror_into(std::optional<std::string_view> params, const JsonObjectBody* extra_args, JsonObjectBody* sp) {
  if (extra_args == nullptr) {
    if (is_null_raw(params)) return false;  // nothing to mirror, nothing to remove
    sp->set_raw("extra_args", JsonObjectWriter().raw("kv_transfer_params", *params).finish());
    return true;
  }
  if (is_null_raw(params) && !extra_args->has("kv_transfer_params")) return false;
  JsonObjectBody edited = *extra_args;
  if (is_null_raw(params)) {
    edited.remove("kv_transfer_params");
  } else {
    edited.set_raw("kv_transfer_params", *params);
  }
  sp->set_raw("extra_args", edited.render());
  return true;
}

}  // namespace

Status check_generate_request(const JsonObjectBody& body, const JsonLimits& limits, GenerateView* view) {
  view->sampling_params.clear();
  view->extra_args.clear();
  view->has_extra_args = false;
  view->choices = 1;
  const auto token_ids = body.get_raw("token_ids");
  if (is_null_raw(token_ids)) return Status(StatusCode::kMissingKey, "token_ids is required (an array of token ids)");
  if (Status st = check_token_ids(*token_ids); !st) return st;
  if (Status st = sampling_params_of(body, limits, &view->sampling_params); !st) return st;
  if (Status st = check_sampling_params(limits, view); !st) return st;
  if (const auto model = body.get_raw("model"); !is_null_raw(model) && model->front() != '"') {
    return Status(StatusCode::kWrongType, "model must be a string, got " + excerpt(*model));
  }
  if (const auto stream = body.get_raw("stream"); !is_null_raw(stream) && *stream != "true" && *stream != "false") {
    return Status(StatusCode::kWrongType, "stream must be a boolean, got " + excerpt(*stream));
  }
  return check_object_or_null(body.get_raw("kv_transfer_params"), "kv_transfer_params");
}

Status check_generate_request(const JsonObjectBody& body, const JsonLimits& limits, int64_t* choices) {
  GenerateView view;
  Status st = check_generate_request(body, limits, &view);
  *choices = st.is_ok() ? view.choices : 1;
  return st;
}

std::string_view generate_token_ids(const JsonObjectBody& body) {
  return body.get_raw("token_ids").value_or(std::string_view());
}

void generate_leg_view(const GenerateView& view, JsonObjectBody* leg) {
  for (std::string_view key : kTokenCounts) {
    if (const auto value = view.sampling_params.get_raw(key)) {
      leg->set_raw(key, *value);
    } else {
      leg->remove(key);
    }
  }
}

void finish_generate_leg(const JsonObjectBody& client, const GenerateView& view, JsonObjectBody* leg) {
  // A copy of the client's indexed sampling_params (its member table; the bytes stay the
  // client's). Rendered into the leg only when an edit changed it: an unchanged one renders to
  // the client's bytes, which the leg holds already.
  JsonObjectBody sp = view.sampling_params;
  bool changed = false;
  for (std::string_view key : kTokenCounts) {
    const auto before = sp.get_raw(key);
    if (const auto value = leg->get_raw(key)) {
      if (!before || *before != *value) {
        sp.set_raw(key, *value);
        changed = true;
      }
    } else if (before) {
      sp.remove(key);
      changed = true;
    }
    if (const auto original = client.get_raw(key)) {
      leg->set_raw(key, *original);
    } else {
      leg->remove(key);
    }
  }
  // sp's extra_args is the client's (the edits above touch only the token counts).
  if (mirror_into(leg->get_raw("kv_transfer_params"), view.has_extra_args ? &view.extra_args : nullptr, &sp)) {
    changed = true;
  }
  if (changed) leg->set_raw("sampling_params", sp.render());
}

Status mirror_generate_kv_params(const JsonLimits& limits, JsonObjectBody* leg) {
  std::string rendered;
  {
    JsonObjectBody sp;
    if (Status st = sampling_params_of(*leg, limits, &sp); !st) return st;
    const auto extra = sp.get_raw("extra_args");
    JsonObjectBody extra_args;
    if (!is_null_raw(extra)) {
      if (Status st = JsonObjectBody::parse_member_borrowed(*extra, limits, &extra_args); !st) {
        return prefixed(st, "sampling_params.extra_args: ");
      }
    }
    if (!mirror_into(leg->get_raw("kv_transfer_params"), is_null_raw(extra) ? nullptr : &extra_args, &sp)) {
      return Status::ok();
    }
    rendered = sp.render();
  }
  leg->set_raw("sampling_params", rendered);
  return Status::ok();
}

}  // namespace pdr::proto
