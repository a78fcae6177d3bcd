// Path normalisation (contract in request_path.h).
#include "router/http/request_path.h"

#include <vector>

namespace pdr::http {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Status refuse(std::string what) { return Status(StatusCode::kInvalidValue, "request path " + what); }

// RFC 3986 pchar without pct-encoded: unreserved / sub-delims / ":" / "@"; plus '/'.
bool plain_in_path(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '-': case '.': case '_': case '~':                                         // unreserved
    case '!': case '$': case '&': case '\'': case '(': case ')': case '*': case '+':  // sub-delims
    case ',': case ';': case '=':
    case ':': case '@': case '/':
      return true;
    default:
      return false;
  }
}

}  // namespace

Status normalize_path(std::string_view raw, std::string* out) {
  if (raw.empty() || raw.front() != '/') return refuse("must start with '/'");
  // Decode segment by segment: a decoded '/' is refused, so the raw slashes are the only
  // separators and decoding cannot create new segments.
  std::vector<std::string> segments;
  std::string segment;
  bool trailing_slash = false;
  size_t i = 1;
  for (;;) {
    segment.clear();
    while (i < raw.size() && raw[i] != '/') {
      char c = raw[i];
      if (c == '%') {
        const int hi = i + 2 < raw.size() ? hex_value(raw[i + 1]) : -1;
        const int lo = i + 2 < raw.size() ? hex_value(raw[i + 2]) : -1;
        if (hi < 0 || lo < 0) return refuse("has an invalid percent escape at byte " + std::to_string(i));
        c = static_cast<char>(hi * 16 + lo);
        if (c == '/') return refuse("has an encoded '/' (%2F)");
        i += 3;
      } else {
        ++i;
      }
      const auto u = static_cast<unsigned char>(c);
      if (u == 0) return refuse("has a NUL byte");
      if (u < 0x20 || u >= 0x7f) return refuse("has a byte outside printable ASCII (" + std::to_string(u) + ")");
      segment.push_back(c);
    }
    const bool last = i >= raw.size();
    if (segment == "..") {
      if (segments.empty()) return refuse("climbs above the root with '..'");
      segments.pop_back();
    } else if (!segment.empty() && segment != ".") {
      segments.push_back(segment);
    }
    if (last) {
      // "/a/", "/a/.", "/a/.." and "/a//" all end on a directory.
      trailing_slash = segment.empty() || segment == "." || segment == "..";
      break;
    }
    ++i;  // the '/'
  }
  std::string path;
  for (const std::string& s : segments) {
    path += '/';
    path += s;
  }
  if (path.empty() || trailing_slash) path += '/';
  *out = std::move(path);
  return Status::ok();
}

std::string encode_path(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(path.size());
  for (const char c : path) {
    if (plain_in_path(c)) {
      out.push_back(c);
    } else {
      const auto u = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    }
  }
  return out;
}

}  // namespace pdr::http
