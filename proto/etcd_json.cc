#include "proto/etcd_json.h"

#include <simdjson.h>

#include <array>
#include <charconv>

namespace pdr::proto {

namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_reverse() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (int i = 0; i < 64; ++i) table[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr std::array<int8_t, 256> kReverse = make_reverse();

// JSON string body for text pdrouter sends (user names, passwords): quotes, backslashes and
// control characters escaped.
void append_json_string(std::string* out, std::string_view text) {
  out->push_back('"');
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 15]);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

Status too_large(std::string_view what, size_t limit) {
  return Status(StatusCode::kTooLarge,
                "etcd answer: " + std::string(what) + " over " + std::to_string(limit) + " bytes");
}

// grpc-gateway writes int64 as a JSON string; a number is accepted too. Absent = 0.
Status get_int64(simdjson::dom::object object, std::string_view key, int64_t* out) {
  simdjson::dom::element element;
  if (object.at_key(key).get(element) != simdjson::SUCCESS) {
    *out = 0;
    return Status::ok();
  }
  std::string_view text;
  if (element.get_string().get(text) == simdjson::SUCCESS) {
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
      return Status(StatusCode::kOutOfRange, "etcd answer: '" + std::string(key) + "' is not an int64");
    }
    *out = value;
    return Status::ok();
  }
  int64_t value = 0;
  if (element.get_int64().get(value) == simdjson::SUCCESS) {
    *out = value;
    return Status::ok();
  }
  return Status(StatusCode::kWrongType, "etcd answer: '" + std::string(key) + "' is not an int64");
}

Status get_bool(simdjson::dom::object object, std::string_view key, bool* out) {
  simdjson::dom::element element;
  *out = false;
  if (object.at_key(key).get(element) != simdjson::SUCCESS) return Status::ok();
  if (element.get_bool().get(*out) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "etcd answer: '" + std::string(key) + "' is not a boolean");
  }
  return Status::ok();
}

Status get_string(simdjson::dom::object object, std::string_view key, std::string* out) {
  simdjson::dom::element element;
  out->clear();
  if (object.at_key(key).get(element) != simdjson::SUCCESS) return Status::ok();
  std::string_view text;
  if (element.get_string().get(text) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "etcd answer: '" + std::string(key) + "' is not a string");
  }
  *out = std::string(text);
  return Status::ok();
}

Status get_bytes(simdjson::dom::object object, std::string_view key, size_t limit, std::string* out) {
  std::string text;
  if (Status st = get_string(object, key, &text); !st) return st;
  if (text.size() > (limit + 2) / 3 * 4) return too_large(key, limit);
  if (!base64_decode(text, out)) {
    return Status(StatusCode::kMalformed, "etcd answer: '" + std::string(key) + "' is not base64");
  }
  if (out->size() > limit) return too_large(key, limit);
  return Status::ok();
}

Status parse_root(simdjson::dom::parser& parser, std::string_view json, size_t limit,
                  simdjson::dom::object* root) {
  if (json.size() > limit) return too_large("answer", limit);
  simdjson::dom::element element;
  if (auto err = parser.parse(json.data(), json.size()).get(element); err != simdjson::SUCCESS) {
    return Status(StatusCode::kMalformed, std::string("etcd answer is not JSON: ") + simdjson::error_message(err));
  }
  if (element.get_object().get(*root) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "etcd answer is not a JSON object");
  }
  return Status::ok();
}

// Reads the header revision, or the error (top-level strings, or the stream form {"error": {}}).
Status read_answer(simdjson::dom::object object, EtcdAnswer* out) {
  *out = EtcdAnswer{};
  simdjson::dom::element error;
  if (object.at_key("error").get(error) == simdjson::SUCCESS) {
    out->is_error = true;
    simdjson::dom::object nested;
    if (error.get_object().get(nested) == simdjson::SUCCESS) object = nested;
    int64_t code = 0;
    if (Status st = get_int64(object, "code", &code); !st) return st;
    if (code == 0) {
      if (Status st = get_int64(object, "grpc_code", &code); !st) return st;
    }
    if (code < 0 || code > 1000) return Status(StatusCode::kOutOfRange, "etcd answer: error code out of range");
    out->grpc_code = static_cast<int>(code);
    if (Status st = get_string(object, "message", &out->error); !st) return st;
    if (out->error.empty()) {
      std::string_view text;
      if (error.get_string().get(text) == simdjson::SUCCESS) out->error = std::string(text);
    }
    if (out->error.empty()) out->error = "etcd error without a message";
    return Status::ok();
  }
  simdjson::dom::element header_element;
  if (object.at_key("header").get(header_element) == simdjson::SUCCESS) {
    simdjson::dom::object header;
    if (header_element.get_object().get(header) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "etcd answer: 'header' is not an object");
    }
    if (Status st = get_int64(header, "revision", &out->revision); !st) return st;
  }
  return Status::ok();
}

// A key-value etcd holds. Its key and value bytes are whatever some writer put there: one that
// pdrouter refuses (over its limit, or not base64) refuses that key-value alone, never the
// whole answer (a single oversized value would otherwise stop every replica's range and watch).
// A refused value leaves kv->value empty and says why in kv->refused; a refused key sets
// *key_refused (the key-value is then unusable: the caller skips it). A key-value that is not
// shaped as etcd shapes one (not an object, a field of the wrong type) fails the answer.
Status read_kv(simdjson::dom::element element, EtcdKeyValue* kv, bool* key_refused) {
  *key_refused = false;
  simdjson::dom::object object;
  if (element.get_object().get(object) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "etcd answer: a key-value is not an object");
  }
  if (Status st = get_int64(object, "create_revision", &kv->create_revision); !st) return st;
  if (Status st = get_int64(object, "mod_revision", &kv->mod_revision); !st) return st;
  if (Status st = get_int64(object, "version", &kv->version); !st) return st;
  if (Status st = get_int64(object, "lease", &kv->lease); !st) return st;
  auto refused_data = [](const Status& st) {
    return st.code() == StatusCode::kTooLarge || st.code() == StatusCode::kMalformed;
  };
  if (Status st = get_bytes(object, "key", kMaxEtcdKeyBytes, &kv->key); !st) {
    if (!refused_data(st)) return st;
    kv->key.clear();
    *key_refused = true;
    return Status::ok();
  }
  if (kv->key.empty()) return Status(StatusCode::kMissingKey, "etcd answer: a key-value without a key");
  if (Status st = get_bytes(object, "value", kMaxEtcdValueBytes, &kv->value); !st) {
    if (!refused_data(st)) return st;
    kv->value.clear();
    kv->refused = st.message();
  }
  return Status::ok();
}

// The object under "result" when present (streamed answers), else the root itself.
Status unwrap_result(simdjson::dom::object root, simdjson::dom::object* out) {
  simdjson::dom::element result;
  if (root.at_key("result").get(result) != simdjson::SUCCESS) {
    *out = root;
    return Status::ok();
  }
  if (result.get_object().get(*out) != simdjson::SUCCESS) {
    return Status(StatusCode::kWrongType, "etcd answer: 'result' is not an object");
  }
  return Status::ok();
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = (static_cast<uint8_t>(bytes[i]) << 16) | (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[(n >> 18) & 63]);
    out.push_back(kAlphabet[(n >> 12) & 63]);
    out.push_back(kAlphabet[(n >> 6) & 63]);
    out.push_back(kAlphabet[n & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) n |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[(n >> 18) & 63]);
    out.push_back(kAlphabet[(n >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(n >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool base64_decode(std::string_view text, std::string* out) {
  if (text.size() % 4 != 0) return false;
  std::string decoded;
  decoded.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int pad = 0;
    if (last && text[i + 3] == '=') pad = text[i + 2] == '=' ? 2 : 1;
    uint32_t n = 0;
    for (int j = 0; j < 4; ++j) {
      if (j >= 4 - pad) {
        n <<= 6;
        continue;
      }
      const int8_t v = kReverse[static_cast<uint8_t>(text[i + j])];
      if (v < 0) return false;
      n = (n << 6) | static_cast<uint32_t>(v);
    }
    decoded.push_back(static_cast<char>((n >> 16) & 0xff));
    if (pad < 2) decoded.push_back(static_cast<char>((n >> 8) & 0xff));
    if (pad < 1) decoded.push_back(static_cast<char>(n & 0xff));
    // Canonical form only: the bits under the padding are zero.
    if ((pad == 1 && (n & 0xff) != 0) || (pad == 2 && (n & 0xffff) != 0)) return false;
  }
  *out = std::move(decoded);
  return true;
}

std::string etcd_prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string encode_etcd_put(std::string_view key, std::string_view value, int64_t lease) {
  std::string out = "{\"key\":\"" + base64_encode(key) + "\",\"value\":\"" + base64_encode(value) + "\"";
  if (lease != 0) out += ",\"lease\":\"" + std::to_string(lease) + "\"";
  out += "}";
  return out;
}

std::string encode_etcd_range(std::string_view key, std::string_view range_end) {
  return "{\"key\":\"" + base64_encode(key) + "\",\"range_end\":\"" + base64_encode(range_end) + "\"}";
}

std::string encode_etcd_range_page(std::string_view key, std::string_view range_end, const EtcdRangePage& page) {
  std::string out = "{\"key\":\"" + base64_encode(key) + "\",\"range_end\":\"" + base64_encode(range_end) + "\"";
  if (page.limit > 0) out += ",\"limit\":\"" + std::to_string(page.limit) + "\"";
  if (page.revision > 0) out += ",\"revision\":\"" + std::to_string(page.revision) + "\"";
  if (page.keys_only) out += ",\"keys_only\":true";
  out += "}";
  return out;
}

std::string encode_etcd_delete_range(std::string_view key, std::string_view range_end) {
  if (range_end.empty()) return "{\"key\":\"" + base64_encode(key) + "\"}";
  return encode_etcd_range(key, range_end);
}

std::string encode_etcd_lease_grant(int64_t ttl_seconds) {
  return "{\"TTL\":\"" + std::to_string(ttl_seconds) + "\"}";
}

std::string encode_etcd_lease_id(int64_t id) { return "{\"ID\":\"" + std::to_string(id) + "\"}"; }

std::string encode_etcd_watch_create(std::string_view key, std::string_view range_end,
                                     int64_t start_revision) {
  std::string out = "{\"create_request\":{\"key\":\"" + base64_encode(key) + "\",\"range_end\":\"" +
                    base64_encode(range_end) + "\"";
  if (start_revision > 0) out += ",\"start_revision\":\"" + std::to_string(start_revision) + "\"";
  out += "}}";
  return out;
}

std::string encode_etcd_authenticate(std::string_view name, std::string_view password) {
  std::string out = "{\"name\":";
  append_json_string(&out, name);
  out += ",\"password\":";
  append_json_string(&out, password);
  out += "}";
  return out;
}

Status parse_etcd_answer(std::string_view json, EtcdAnswer* out) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (Status st = parse_root(parser, json, kMaxEtcdAnswerBytes, &root); !st) return st;
  EtcdAnswer answer;
  if (Status st = read_answer(root, &answer); !st) return st;
  *out = std::move(answer);
  return Status::ok();
}

Status parse_etcd_range(std::string_view json, EtcdRangeAnswer* out) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (Status st = parse_root(parser, json, kMaxEtcdAnswerBytes, &root); !st) return st;
  EtcdRangeAnswer range;
  if (Status st = read_answer(root, &range.answer); !st) return st;
  if (Status st = get_bool(root, "more", &range.more); !st) return st;
  simdjson::dom::element kvs_element;
  if (!range.answer.is_error && root.at_key("kvs").get(kvs_element) == simdjson::SUCCESS) {
    simdjson::dom::array kvs;
    if (kvs_element.get_array().get(kvs) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "etcd answer: 'kvs' is not an array");
    }
    simdjson::dom::element last;
    bool any = false;
    for (simdjson::dom::element item : kvs) {
      last = item;
      any = true;
      EtcdKeyValue kv;
      bool key_refused = false;
      if (Status st = read_kv(item, &kv, &key_refused); !st) return st;
      if (key_refused) {
        ++range.skipped;
        continue;
      }
      range.kvs.push_back(std::move(kv));
    }
    // Where the next page starts, even when the last key was refused (over the key limit):
    // bounded by the answer's own size.
    if (any) {
      if (Status st = get_bytes(last.get_object().value_unsafe(), "key", kMaxEtcdAnswerBytes, &range.last_key); !st) {
        return st;
      }
    }
  }
  *out = std::move(range);
  return Status::ok();
}

Status parse_etcd_lease(std::string_view json, EtcdLeaseAnswer* out) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (Status st = parse_root(parser, json, kMaxEtcdAnswerBytes, &root); !st) return st;
  simdjson::dom::object object;
  if (Status st = unwrap_result(root, &object); !st) return st;
  EtcdLeaseAnswer lease;
  if (Status st = read_answer(root.at_key("error").error() == simdjson::SUCCESS ? root : object, &lease.answer); !st) {
    return st;
  }
  if (Status st = get_int64(object, "ID", &lease.id); !st) return st;
  if (Status st = get_int64(object, "TTL", &lease.ttl); !st) return st;
  if (lease.ttl < 0) return Status(StatusCode::kOutOfRange, "etcd answer: negative lease TTL");
  *out = lease;
  return Status::ok();
}

Status parse_etcd_watch(std::string_view json, EtcdWatchAnswer* out) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (Status st = parse_root(parser, json, kMaxEtcdWatchLineBytes, &root); !st) return st;
  EtcdWatchAnswer watch;
  if (root.at_key("error").error() == simdjson::SUCCESS) {
    if (Status st = read_answer(root, &watch.answer); !st) return st;
    *out = std::move(watch);
    return Status::ok();
  }
  simdjson::dom::object object;
  if (Status st = unwrap_result(root, &object); !st) return st;
  if (Status st = read_answer(object, &watch.answer); !st) return st;
  if (Status st = get_bool(object, "created", &watch.created); !st) return st;
  if (Status st = get_bool(object, "canceled", &watch.canceled); !st) return st;
  if (Status st = get_int64(object, "compact_revision", &watch.compact_revision); !st) return st;
  if (Status st = get_string(object, "cancel_reason", &watch.cancel_reason); !st) return st;
  simdjson::dom::element events_element;
  if (object.at_key("events").get(events_element) == simdjson::SUCCESS) {
    simdjson::dom::array events;
    if (events_element.get_array().get(events) != simdjson::SUCCESS) {
      return Status(StatusCode::kWrongType, "etcd answer: 'events' is not an array");
    }
    for (simdjson::dom::element item : events) {
      simdjson::dom::object event_object;
      if (item.get_object().get(event_object) != simdjson::SUCCESS) {
        return Status(StatusCode::kWrongType, "etcd answer: a watch event is not an object");
      }
      EtcdEvent event;
      std::string type;
      if (Status st = get_string(event_object, "type", &type); !st) return st;
      if (type == "DELETE") {
        event.is_delete = true;
      } else if (!type.empty() && type != "PUT") {
        return Status(StatusCode::kInvalidValue, "etcd answer: watch event type '" + type.substr(0, 32) + "'");
      }
      simdjson::dom::element kv;
      if (event_object.at_key("kv").get(kv) != simdjson::SUCCESS) {
        return Status(StatusCode::kMissingKey, "etcd answer: a watch event without 'kv'");
      }
      bool key_refused = false;
      if (Status st = read_kv(kv, &event.kv, &key_refused); !st) return st;
      if (key_refused) {
        ++watch.skipped;
        continue;
      }
      watch.events.push_back(std::move(event));
    }
  }
  *out = std::move(watch);
  return Status::ok();
}

Status parse_etcd_token(std::string_view json, EtcdAnswer* answer, std::string* token) {
  simdjson::dom::parser parser;
  simdjson::dom::object root;
  if (Status st = parse_root(parser, json, kMaxEtcdAnswerBytes, &root); !st) return st;
  EtcdAnswer parsed;
  if (Status st = read_answer(root, &parsed); !st) return st;
  std::string text;
  if (Status st = get_string(root, "token", &text); !st) return st;
  if (text.size() > kMaxEtcdKeyBytes) return too_large("token", kMaxEtcdKeyBytes);
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) {
      return Status(StatusCode::kInvalidValue, "etcd answer: token with a control character or space");
    }
  }
  *answer = std::move(parsed);
  *token = std::move(text);
  return Status::ok();
}

bool EtcdLineSplitter::feed(std::string_view bytes) {
  if (broken_) return false;
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes);
  // Over the limit only when no newline closes the line that grew too long.
  const size_t newline = buffer_.rfind('\n');
  const size_t open = newline == std::string::npos ? buffer_.size() : buffer_.size() - newline - 1;
  if (open > max_line_) {
    broken_ = true;
    buffer_.clear();
    return false;
  }
  return true;
}

bool EtcdLineSplitter::next_line(std::string_view* line) {
  while (!broken_) {
    const size_t newline = buffer_.find('\n', consumed_);
    if (newline == std::string::npos) return false;
    std::string_view candidate(buffer_.data() + consumed_, newline - consumed_);
    consumed_ = newline + 1;
    if (!candidate.empty() && candidate.back() == '\r') candidate.remove_suffix(1);
    if (candidate.size() > max_line_) {
      broken_ = true;
      return false;
    }
    if (candidate.find_first_not_of(" \t") == std::string_view::npos) continue;
    *line = candidate;
    return true;
  }
  return false;
}

}  // namespace pdr::proto
