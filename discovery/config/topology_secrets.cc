// Reasons behind secret resolution; contracts are in topology_secrets.h.
#include "discovery/config/topology_secrets.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace pdr::config {

using yaml::fail;
using yaml::Field;
using yaml::has_control_chars;
using yaml::kMaxStringBytes;
using yaml::MapReader;
using yaml::quoted_excerpt;
using yaml::read_string;
using yaml::Source;

namespace {

constexpr size_t kMaxSecretFileBytes = 4096;

bool is_env_var_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string resolve_beside(const std::string& topology_file, const std::string& path) {
  size_t slash = topology_file.rfind('/');
  if (path.empty() || path[0] == '/' || slash == std::string::npos) return path;
  return topology_file.substr(0, slash + 1) + path;
}

std::string strip_trailing_newline(std::string s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
  return s;
}

}  // namespace

// O_NONBLOCK keeps a FIFO from hanging the loader; fstat then refuses it as not a regular file.
Status read_small_file(const std::string& path, size_t limit, std::string* out) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return Status(StatusCode::kIoError, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(StatusCode::kIoError, "not a regular file");
  }
  std::string data;
  data.resize(limit + 1);
  size_t got = 0;
  while (got < data.size()) {
    ssize_t n = ::read(fd, data.data() + got, data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Status(StatusCode::kIoError, fmt::format("cannot read: {}", std::strerror(err)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got > limit) {
    return Status(StatusCode::kTooLarge, fmt::format("file is larger than {} bytes", limit));
  }
  data.resize(got);
  *out = std::move(data);
  return Status::ok();
}

void read_env_secret(const Source& src, MapReader& r, std::string_view key, std::string* env_name,
                     std::string* secret) {
  r.with(key, [&](const Field& f) {
    std::string name;
    Status s = read_string(src, f, kMaxStringBytes, &name);
    if (!s) return s;
    if (name.empty()) return Status::ok();  // explicitly "no secret"
    if (!is_env_var_name(name)) {
      return fail(src, f, StatusCode::kInvalidValue,
                  fmt::format("{} is not an environment variable name", quoted_excerpt(name)));
    }
    const char* value = std::getenv(name.c_str());
    if (value == nullptr || *value == '\0') {
      return fail(src, f, StatusCode::kNotFound,
                  fmt::format("environment variable '{}' is not set or empty", name));
    }
    if (has_control_chars(value)) {
      return fail(src, f, StatusCode::kInvalidValue,
                  fmt::format("environment variable '{}' contains control characters", name));
    }
    *env_name = std::move(name);
    *secret = value;
    return Status::ok();
  });
}

void read_file_secret(const Source& src, MapReader& r, std::string_view key, std::string* file,
                      std::string* secret) {
  std::string path;
  read_text_file(src, r, key, kMaxSecretFileBytes, &path, [&](const Field& f, std::string_view text) {
    const std::string resolved = resolve_beside(src.filename, path);
    std::string content = strip_trailing_newline(std::string(text));
    if (content.empty())
      return fail(src, f, StatusCode::kInvalidValue, fmt::format("'{}' is empty", resolved));
    if (has_control_chars(content)) {
      return fail(src, f, StatusCode::kInvalidValue,
                  fmt::format("'{}' contains control characters (one line expected)", resolved));
    }
    *file = path;
    *secret = std::move(content);
    return Status::ok();
  });
}

void read_text_file(const Source& src, MapReader& r, std::string_view key, size_t limit, std::string* file,
                    const std::function<Status(const Field&, std::string_view)>& use) {
  r.with(key, [&](const Field& f) {
    std::string path;
    Status s = read_string(src, f, 4096, &path);
    if (!s || path.empty()) return s;
    std::string resolved = resolve_beside(src.filename, path);
    std::string content;
    s = read_small_file(resolved, limit, &content);
    if (!s) return fail(src, f, s.code(), fmt::format("'{}': {}", resolved, s.message()));
    *file = std::move(path);
    return use(f, content);
  });
}

}  // namespace pdr::config
