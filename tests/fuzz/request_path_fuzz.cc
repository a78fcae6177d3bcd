// Fuzzes router/http/request_path: the request path is untrusted bytes, and what normalize_path makes of
// it is what every route lookup, key check and pass-through decision reads. Properties: a
// normalised path starts with '/', holds only printable ASCII, has no empty, "." or ".."
// segment (a trailing '/' aside); normalising its encoded spelling gives it back unchanged (so
// the path relayed to a node, encode_path's, is read by the node as pdrouter read it); and a
// refused path leaves the output untouched.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "router/http/request_path.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  std::string out = "untouched";
  if (!pdr::http::normalize_path(raw, &out).is_ok()) {
    if (out != "untouched") std::abort();
    return 0;
  }
  if (out.empty() || out.front() != '/') std::abort();
  for (const char c : out) {
    if (c < 0x20 || c > 0x7e) std::abort();
  }
  const std::string_view body = out.size() > 1 && out.back() == '/' ? std::string_view(out).substr(0, out.size() - 1)
                                                                    : std::string_view(out);
  if (body != "/") {
    for (size_t at = 1;;) {
      const size_t slash = body.find('/', at);
      const std::string_view segment = body.substr(at, slash == std::string_view::npos ? body.npos : slash - at);
      if (segment.empty() || segment == "." || segment == "..") std::abort();
      if (slash == std::string_view::npos) break;
      at = slash + 1;
    }
  }
  std::string again;
  if (!pdr::http::normalize_path(pdr::http::encode_path(out), &again).is_ok() || again != out) std::abort();
  return 0;
}
