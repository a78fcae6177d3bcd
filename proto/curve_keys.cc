#include "proto/curve_keys.h"

#include <fmt/format.h>
#include <zmq.h>

#include <algorithm>
#include <cstdint>
#include <set>

namespace pdr::proto {
namespace {

constexpr size_t kZ85KeyChars = 40;
constexpr size_t kMaxKeys = 100'000;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A Z85 key is 40 characters that decode to 32 bytes.
bool valid_z85_key(std::string_view key) {
  if (key.size() != kZ85KeyChars) return false;
  char text[kZ85KeyChars + 1];
  std::copy(key.begin(), key.end(), text);
  text[kZ85KeyChars] = '\0';
  uint8_t decoded[32];
  return zmq_z85_decode(decoded, text) != nullptr;
}

// One line's key: the bare key, or the quoted value of `<field> = "<key>"`. "" when the line
// holds neither (blank, comment, certificate section names, other fields).
std::string_view key_on_line(std::string_view line, std::string_view field) {
  line = trim(line);
  // Z85 uses '#' and '=' too, so a valid bare key is recognised before comments and fields.
  if (valid_z85_key(line)) return line;
  if (line.empty() || line.front() == '#') return {};
  if (line.substr(0, field.size()) != field) return {};
  std::string_view rest = trim(line.substr(field.size()));
  if (rest.empty() || rest.front() != '=') return {};
  rest = trim(rest.substr(1));
  if (rest.size() >= 2 && rest.front() == '"' && rest.back() == '"') rest = rest.substr(1, rest.size() - 2);
  return rest;
}

// Lines of a key file that hold no key and are fine: blank, comments, certificate section names
// ("curve", "metadata") and other certificate fields (`name = "value"`).
bool harmless_line(std::string_view line) {
  line = trim(line);
  if (line.empty() || line.front() == '#' || line.find('=') != std::string_view::npos) return true;
  return std::all_of(line.begin(), line.end(), [](char c) { return (c >= 'a' && c <= 'z') || c == '-' || c == '_'; });
}

template <typename Fn>
void for_each_line(std::string_view text, Fn fn) {
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    fn(text.substr(0, nl), ++line_no);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
}

Status single_key(std::string_view text, std::string_view field, std::string* out) {
  std::string found;
  Status st = Status::ok();
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    if (!st) return;
    std::string_view key = key_on_line(line, field);
    if (key.empty()) return;
    if (!valid_z85_key(key)) {
      st = Status(StatusCode::kInvalidValue, fmt::format("line {}: not a 40-character Z85 CURVE key", line_no));
    } else if (found.empty()) {
      found = std::string(key);
    }
  });
  if (!st) return st;
  if (found.empty()) {
    return Status(StatusCode::kInvalidValue,
                  fmt::format("no CURVE key found (a 40-character Z85 line, or {} = \"...\")", field));
  }
  *out = std::move(found);
  return Status::ok();
}

}  // namespace

Status generate_curve_key_pair(CurveKeyPair* out) {
  char pub[kZ85KeyChars + 1];
  char sec[kZ85KeyChars + 1];
  if (zmq_curve_keypair(pub, sec) != 0) {
    return Status(StatusCode::kInternal, "this libzmq was built without CURVE support");
  }
  out->public_z85 = pub;
  out->secret_z85 = sec;
  return Status::ok();
}

Status parse_curve_secret_key(std::string_view text, CurveKeyPair* out) {
  std::string secret;
  Status st = single_key(text, "secret-key", &secret);
  if (!st) return st;
  char pub[kZ85KeyChars + 1];
  if (zmq_curve_public(pub, secret.c_str()) != 0) {
    return Status(StatusCode::kInvalidValue, "cannot derive the public key from this secret key");
  }
  out->public_z85 = pub;
  out->secret_z85 = std::move(secret);
  return Status::ok();
}

Status parse_curve_public_key(std::string_view text, std::string* z85_out) {
  return single_key(text, "public-key", z85_out);
}

Status parse_curve_public_keys(std::string_view text, std::vector<std::string>* z85_out) {
  std::set<std::string> keys;
  Status st = Status::ok();
  for_each_line(text, [&](std::string_view line, size_t line_no) {
    if (!st) return;
    std::string_view key = key_on_line(line, "public-key");
    if (key.empty() && !harmless_line(line)) {
      st = Status(StatusCode::kInvalidValue, fmt::format("line {}: neither a key, a comment nor a certificate line", line_no));
      return;
    }
    if (key.empty()) return;
    if (!valid_z85_key(key)) {
      st = Status(StatusCode::kInvalidValue, fmt::format("line {}: not a 40-character Z85 CURVE key", line_no));
      return;
    }
    keys.emplace(key);
    if (keys.size() > kMaxKeys) {
      st = Status(StatusCode::kTooLarge, fmt::format("more than {} keys", kMaxKeys));
    }
  });
  if (!st) return st;
  z85_out->assign(keys.begin(), keys.end());
  return Status::ok();
}

std::string curve_certificate(const CurveKeyPair& keys, bool include_secret) {
  std::string text = "#   pdrouter discovery CURVE certificate (ZPL, as zmq.auth writes)\n";
  text += include_secret ? "#   SECRET: keep this file private (mode 0600)\n" : "#   public key only: safe to share\n";
  text += "curve\n";
  text += fmt::format("    public-key = \"{}\"\n", keys.public_z85);
  if (include_secret) text += fmt::format("    secret-key = \"{}\"\n", keys.secret_z85);
  return text;
}

std::string curve_key_z85(std::string_view bytes) {
  if (bytes.size() != 32) return {};
  char text[kZ85KeyChars + 1];
  if (zmq_z85_encode(text, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) == nullptr) return {};
  return text;
}

}  // namespace pdr::proto
