#include "proto/etcd_conversation.h"

#include <charconv>
#include <optional>

#include "proto/json_splice.h"

namespace pdr::proto {
namespace {

constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
constexpr std::string_view kSegment = "conversations/";
constexpr std::string_view kAnonymous = "anonymous";
// A decode key is host:port or a pod name; a replica id is short too.
constexpr size_t kMaxNameBytes = 1024;

int sextet_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

int lower_hex_of(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

Status required_string(const JsonObjectBody& body, std::string_view key, std::string* out) {
  std::optional<std::string> value;
  Status st = body.get_string(key, &value);
  if (!st.is_ok()) return st;
  if (!value) return Status(StatusCode::kMissingKey, "conversation entry has no " + std::string(key));
  if (value->size() > kMaxNameBytes) {
    return Status(StatusCode::kTooLarge, "conversation entry's " + std::string(key) + " is over " +
                                             std::to_string(kMaxNameBytes) + " bytes");
  }
  *out = std::move(*value);
  return Status::ok();
}

}  // namespace

std::string base64url_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() * 4 + 2) / 3);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) |
                       uint32_t(uint8_t(bytes[i + 2]));
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest == 1) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
  } else if (rest == 2) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
  }
  return out;
}

bool base64url_decode(std::string_view text, std::string* out) {
  // A length of 1 mod 4 cannot come from any byte string.
  if (text.size() % 4 == 1) return false;
  std::string decoded;
  decoded.reserve(text.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : text) {
    const int s = sextet_of(c);
    if (s < 0) return false;
    acc = (acc << 6) | uint32_t(s);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      decoded += char((acc >> bits) & 0xff);
    }
  }
  // The leftover bits (2 or 4) must be zero: one canonical text per byte string, so two spellings
  // never name the same conversation under different keys.
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return false;
  *out = std::move(decoded);
  return true;
}

std::string conversation_binding_text(std::string_view binding) {
  if (binding.empty()) return std::string(kAnonymous);
  constexpr std::string_view kHex = "0123456789abcdef";
  std::string out;
  out.reserve(binding.size() * 2);
  for (char c : binding) {
    out += kHex[uint8_t(c) >> 4];
    out += kHex[uint8_t(c) & 15];
  }
  return out;
}

bool parse_conversation_binding_text(std::string_view text, std::string* binding) {
  if (text == kAnonymous) {
    binding->clear();
    return true;
  }
  if (text.size() != 2 * kConversationBindingBytes) return false;
  std::string out;
  out.reserve(kConversationBindingBytes);
  for (size_t i = 0; i < text.size(); i += 2) {
    const int hi = lower_hex_of(text[i]), lo = lower_hex_of(text[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out += char((hi << 4) | lo);
  }
  *binding = std::move(out);
  return true;
}

std::string etcd_conversations_prefix(std::string_view prefix) {
  std::string out(prefix);
  out += kSegment;
  return out;
}

std::string etcd_conversation_key(std::string_view prefix, std::string_view binding, std::string_view conversation_id) {
  std::string out = etcd_conversations_prefix(prefix);
  out += conversation_binding_text(binding);
  out += '/';
  out += base64url_encode(conversation_id);
  return out;
}

Status parse_etcd_conversation_key(std::string_view prefix, std::string_view key, std::string* binding,
                                   std::string* conversation_id) {
  if (key.size() < prefix.size() + kSegment.size() || key.substr(0, prefix.size()) != prefix ||
      key.substr(prefix.size(), kSegment.size()) != kSegment) {
    return Status(StatusCode::kInvalidValue, "not a conversation key");
  }
  const std::string_view rest = key.substr(prefix.size() + kSegment.size());
  const size_t slash = rest.find('/');
  std::string bound;
  if (slash == std::string_view::npos || !parse_conversation_binding_text(rest.substr(0, slash), &bound)) {
    return Status(StatusCode::kMalformed, "conversation key has no client binding");
  }
  const std::string_view segment = rest.substr(slash + 1);
  if (segment.size() > (kMaxConversationIdBytes * 4 + 2) / 3) {
    return Status(StatusCode::kTooLarge, "conversation id is over " + std::to_string(kMaxConversationIdBytes) + " bytes");
  }
  std::string id;
  if (segment.empty() || !base64url_decode(segment, &id)) {
    return Status(StatusCode::kMalformed, "conversation key's id is not unpadded base64url");
  }
  *binding = std::move(bound);
  *conversation_id = std::move(id);
  return Status::ok();
}

std::string encode_etcd_conversation(const EtcdConversationEntry& entry) {
  return JsonObjectWriter()
      .string("writer", entry.writer)
      .string("binding", conversation_binding_text(entry.binding))
      .string("decode", entry.decode_key)
      .raw("epoch", json_uint(entry.decode_epoch))
      .integer("expires_ms", entry.expires_unix_ms)
      .raw("params", entry.prefill_params)
      .finish();
}

Status parse_etcd_conversation(std::string_view value, EtcdConversationEntry* out) {
  if (value.size() > kMaxConversationValueBytes) {
    return Status(StatusCode::kTooLarge, "conversation entry is over " +
                                             std::to_string(kMaxConversationValueBytes) + " bytes");
  }
  JsonLimits limits;
  limits.max_bytes = kMaxConversationValueBytes;
  limits.max_depth = 16;
  JsonObjectBody body;
  Status st = JsonObjectBody::parse_borrowed(value, limits, &body);
  if (!st.is_ok()) return st;

  EtcdConversationEntry entry;
  if (st = required_string(body, "writer", &entry.writer); !st.is_ok()) return st;
  std::string binding_text;
  if (st = required_string(body, "binding", &binding_text); !st.is_ok()) return st;
  if (!parse_conversation_binding_text(binding_text, &entry.binding)) {
    return Status(StatusCode::kInvalidValue, "conversation entry's binding is not a client binding");
  }
  if (st = required_string(body, "decode", &entry.decode_key); !st.is_ok()) return st;
  if (entry.decode_key.empty()) return Status(StatusCode::kInvalidValue, "conversation entry's decode is empty");

  // epoch: an unsigned 64-bit integer (get_int stops at int64's range).
  const std::optional<std::string_view> epoch = body.get_raw("epoch");
  if (!epoch) return Status(StatusCode::kMissingKey, "conversation entry has no epoch");
  const auto [ptr, ec] = std::from_chars(epoch->data(), epoch->data() + epoch->size(), entry.decode_epoch);
  if (ec == std::errc::result_out_of_range) {
    return Status(StatusCode::kOutOfRange, "conversation entry's epoch is outside the 64-bit range");
  }
  if (ec != std::errc() || ptr != epoch->data() + epoch->size()) {
    return Status(StatusCode::kWrongType, "conversation entry's epoch must be an unsigned integer");
  }

  std::optional<int64_t> expires;
  if (st = body.get_int("expires_ms", &expires); !st.is_ok()) return st;
  if (!expires) return Status(StatusCode::kMissingKey, "conversation entry has no expires_ms");
  if (*expires <= 0) return Status(StatusCode::kOutOfRange, "conversation entry's expires_ms must be positive");
  entry.expires_unix_ms = *expires;

  const std::optional<std::string_view> params = body.get_raw("params");
  if (!params) return Status(StatusCode::kMissingKey, "conversation entry has no params");
  JsonObjectBody params_body;
  if (params->empty() || params->front() != '{' ||
      !JsonObjectBody::parse_member_borrowed(*params, limits, &params_body).is_ok()) {
    return Status(StatusCode::kWrongType, "conversation entry's params must be a JSON object");
  }
  entry.prefill_params = std::string(*params);
  *out = std::move(entry);
  return Status::ok();
}

int64_t etcd_conversation_lease_seconds(int64_t ttl_ms) {
  if (ttl_ms <= 0) return 1;
  return (ttl_ms + 999) / 1000;
}

ConversationDeleteVerdict etcd_conversation_delete_verdict(int64_t delete_revision, int64_t put_revision,
                                                           bool put_in_flight) {
  if (put_in_flight) return ConversationDeleteVerdict::kDefer;
  // Revisions are unique per operation: a delete is never at its put's revision.
  if (put_revision != 0 && delete_revision < put_revision) return ConversationDeleteVerdict::kIgnore;
  return ConversationDeleteVerdict::kApply;
}

bool etcd_conversation_put_is_stale(int64_t put_event_revision, int64_t put_revision) {
  return put_revision != 0 && put_event_revision < put_revision;
}

}  // namespace pdr::proto
