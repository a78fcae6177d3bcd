#include "proto/etcd_session.h"

#include <algorithm>
#include <optional>

#include "proto/etcd_conversation.h"
#include "proto/json_splice.h"

namespace pdr::proto {
namespace {

constexpr std::string_view kSegment = "conversations/session/";
constexpr size_t kMaxNameBytes = 512;

bool printable_name(std::string_view s) {
  return !s.empty() && s.size() <= kMaxNameBytes &&
         std::all_of(s.begin(), s.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

Status required_string(const JsonObjectBody& body, std::string_view key, std::string* out) {
  std::optional<std::string> value;
  Status st = body.get_string(key, &value);
  if (!st.is_ok()) return st;
  if (!value) return Status(StatusCode::kMissingKey, "session binding has no " + std::string(key));
  if (value->size() > kMaxNameBytes) {
    return Status(StatusCode::kTooLarge, "session binding's " + std::string(key) + " is over " +
                                             std::to_string(kMaxNameBytes) + " bytes");
  }
  *out = std::move(*value);
  return Status::ok();
}

}  // namespace

std::string etcd_sessions_prefix(std::string_view prefix) {
  std::string out(prefix);
  out += kSegment;
  return out;
}

std::string etcd_session_key(std::string_view prefix, std::string_view binding, std::string_view session_id) {
  std::string out = etcd_sessions_prefix(prefix);
  out += conversation_binding_text(binding);
  out += '/';
  out += base64url_encode(session_id);
  return out;
}

Status parse_etcd_session_key(std::string_view prefix, std::string_view key, std::string* binding,
                              std::string* session_id) {
  if (key.size() < prefix.size() + kSegment.size() || key.substr(0, prefix.size()) != prefix ||
      key.substr(prefix.size(), kSegment.size()) != kSegment) {
    return Status(StatusCode::kInvalidValue, "not a session key");
  }
  const std::string_view rest = key.substr(prefix.size() + kSegment.size());
  const size_t slash = rest.find('/');
  if (slash == std::string_view::npos) return Status(StatusCode::kMalformed, "session key has no binding segment");
  std::string b, id;
  if (!parse_conversation_binding_text(rest.substr(0, slash), &b)) {
    return Status(StatusCode::kMalformed, "session key's binding is not a client binding");
  }
  const std::string_view encoded = rest.substr(slash + 1);
  if (encoded.size() > (kMaxSessionIdBytes * 4 + 2) / 3) {
    return Status(StatusCode::kTooLarge, "session id is over " + std::to_string(kMaxSessionIdBytes) + " bytes");
  }
  if (encoded.empty() || !base64url_decode(encoded, &id)) {
    return Status(StatusCode::kMalformed, "session key's id is not base64url");
  }
  *binding = std::move(b);
  *session_id = std::move(id);
  return Status::ok();
}

std::string encode_etcd_session(const EtcdSessionEntry& entry) {
  return JsonObjectWriter()
      .string("writer", entry.writer)
      .string("binding", conversation_binding_text(entry.binding))
      .string("prefill", entry.prefill_key)
      .string("decode", entry.decode_key)
      .integer("expires_ms", entry.expires_unix_ms)
      .finish();
}

Status parse_etcd_session(std::string_view value, EtcdSessionEntry* out) {
  if (value.size() > kMaxSessionValueBytes) {
    return Status(StatusCode::kTooLarge, "session binding is over " + std::to_string(kMaxSessionValueBytes) + " bytes");
  }
  JsonLimits limits;
  limits.max_bytes = kMaxSessionValueBytes;
  limits.max_depth = 4;
  JsonObjectBody body;
  Status st = JsonObjectBody::parse_borrowed(value, limits, &body);
  if (!st.is_ok()) return st;
  EtcdSessionEntry entry;
  if (st = required_string(body, "writer", &entry.writer); !st.is_ok()) return st;
  std::string binding_text;
  if (st = required_string(body, "binding", &binding_text); !st.is_ok()) return st;
  if (!parse_conversation_binding_text(binding_text, &entry.binding)) {
    return Status(StatusCode::kInvalidValue, "session binding's binding is not a client binding");
  }
  if (st = required_string(body, "prefill", &entry.prefill_key); !st.is_ok()) return st;
  if (st = required_string(body, "decode", &entry.decode_key); !st.is_ok()) return st;
  if (!printable_name(entry.prefill_key) || !printable_name(entry.decode_key)) {
    return Status(StatusCode::kInvalidValue, "session binding's node key is empty or not printable ASCII");
  }
  std::optional<int64_t> expires;
  if (st = body.get_int("expires_ms", &expires); !st.is_ok()) return st;
  if (!expires) return Status(StatusCode::kMissingKey, "session binding has no expires_ms");
  if (*expires <= 0) return Status(StatusCode::kOutOfRange, "session binding's expires_ms must be positive");
  entry.expires_unix_ms = *expires;
  *out = std::move(entry);
  return Status::ok();
}

}  // namespace pdr::proto
