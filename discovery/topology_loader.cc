// Topology YAML -> validated plain structs. The only translation unit that includes yaml-cpp: every
// yaml-cpp exception is caught here and becomes a Status whose message starts with FILE:LINE:COL.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml-cpp/anchor.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/topology.h"

namespace pdr::discovery {

std::string_view to_string(PolicyName policy) {
  switch (policy) {
    case PolicyName::kRoundRobin:
      return "round_robin";
    case PolicyName::kLeastOutstanding:
      return "least_outstanding";
    case PolicyName::kPowerOfTwo:
      return "power_of_two";
    case PolicyName::kAffinity:
      return "affinity";
  }
  return "unknown";
}

bool parse_policy_name(std::string_view text, PolicyName* out) {
  for (PolicyName p : {PolicyName::kRoundRobin, PolicyName::kLeastOutstanding,
                       PolicyName::kPowerOfTwo, PolicyName::kAffinity}) {
    if (text == to_string(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

namespace {

constexpr size_t kMaxFileBytes = 1 << 20;
constexpr size_t kMaxSecretFileBytes = 4096;
constexpr size_t kMaxNodes = 10000;
constexpr size_t kMaxDepth = 16;
constexpr uint64_t kMaxWorkers = 256;
constexpr uint64_t kDayMs = 24ull * 3600 * 1000;
constexpr uint64_t kMaxU32 = 0xffffffffull;
constexpr size_t kMaxLabels = 32;
constexpr size_t kMaxLabelKeyBytes = 64;
constexpr size_t kMaxLabelValueBytes = 256;
constexpr size_t kMaxStringBytes = 1024;
constexpr std::string_view kPolicyNames = "round_robin, least_outstanding, power_of_two, affinity";
constexpr std::string_view kConnectorNames = "moriio, p2p-nccl, nixl, mooncake, sglang";

// What error messages are prefixed with, and what relative secret-file paths resolve against.
struct Source {
  std::string filename;
};

// One value in the document together with the key that introduced it (undefined for list items)
// and its dotted path ("discovery.ttl_ms", "instances[1].labels.zone").
struct Field {
  YAML::Node key;
  YAML::Node value;
  std::string path;

  // An empty value (`key:`) has no position of its own worth showing; yaml-cpp puts it on the next
  // line, so point at the key instead.
  YAML::Mark mark() const {
    if (value.IsNull() && key.IsDefined() && !key.Mark().is_null()) return key.Mark();
    return value.Mark();
  }
};

Status fail_at(const Source& src, const YAML::Mark& mark, std::string_view path, StatusCode code,
               std::string_view what) {
  std::string msg = src.filename;
  if (!mark.is_null()) msg += fmt::format(":{}:{}", mark.line + 1, mark.column + 1);
  msg += ": ";
  if (!path.empty()) {
    msg += path;
    msg += ": ";
  }
  msg += what;
  return Status(code, std::move(msg));
}

Status fail(const Source& src, const Field& f, StatusCode code, std::string_view what) {
  return fail_at(src, f.mark(), f.path, code, what);
}

std::string quoted_excerpt(std::string_view text) {
  constexpr size_t kMax = 40;
  std::string out = "'";
  out += text.substr(0, kMax);
  if (text.size() > kMax) out += "...";
  out += "'";
  return out;
}

bool is_quoted_or_tagged_string(const YAML::Node& n) {
  // yaml-cpp reports "!" for quoted scalars and "?" for plain, untagged ones.
  return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Scalar:
      return (is_quoted_or_tagged_string(n) ? "the string " : "") + quoted_excerpt(n.Scalar());
  }
  return "an unknown node";
}

bool has_control_chars(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_hint(std::string_view key, const std::vector<std::string_view>& known) {
  std::string_view best;
  size_t best_distance = 3;  // typos of one or two characters get a suggestion
  for (std::string_view k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  if (!best.empty()) return fmt::format("did you mean '{}'?", best);
  return fmt::format("expected one of: {}", fmt::join(known, ", "));
}

// ---- scalar readers -------------------------------------------------------------------------

Status read_uint(const Source& src, const Field& f, uint64_t min, uint64_t max, uint64_t* out,
                 std::string_view what = "an integer") {
  const YAML::Node& n = f.value;
  if (!n.IsScalar()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  const std::string& text = n.Scalar();
  if (n.Tag() != "?" && n.Tag() != "tag:yaml.org,2002:int") {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  if (!text.empty() && text[0] == '-' && text.size() > 1 &&
      std::all_of(text.begin() + 1, text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return fail(
        src, f, StatusCode::kOutOfRange,
        fmt::format("negative numbers are not allowed (got {}; expected {}..{})", text, min, max));
  }
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  bool all_digits =
      !text.empty() && end == text.data() + text.size() &&
      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits || ec == std::errc::invalid_argument) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected {}, got {}", what, describe(n)));
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    return fail(src, f, StatusCode::kOutOfRange,
                fmt::format("{} is out of range ({}..{})", text, min, max));
  }
  *out = v;
  return Status::ok();
}

Status read_string(const Source& src, const Field& f, size_t max_bytes, std::string* out) {
  const YAML::Node& n = f.value;
  if (n.IsNull()) {
    return fail(src, f, StatusCode::kWrongType,
                "expected a string, got null (write \"\" for empty)");
  }
  if (!n.IsScalar()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a string, got {}", describe(n)));
  }
  const std::string& text = n.Scalar();
  if (text.size() > max_bytes) {
    return fail(src, f, StatusCode::kTooLarge,
                fmt::format("string is {} bytes long (limit {})", text.size(), max_bytes));
  }
  if (has_control_chars(text)) {
    return fail(src, f, StatusCode::kInvalidValue, "string contains control characters");
  }
  *out = text;
  return Status::ok();
}

Status read_bool(const Source& src, const Field& f, bool* out) {
  const YAML::Node& n = f.value;
  if (n.IsScalar() && !is_quoted_or_tagged_string(n)) {
    std::string lower = n.Scalar();
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == "true" || lower == "false") {
      *out = lower == "true";
      return Status::ok();
    }
  }
  return fail(src, f, StatusCode::kWrongType,
              fmt::format("expected true or false, got {}", describe(n)));
}

// ---- maps ---------------------------------------------------------------------------------------

// Reads one YAML map section key by key. Calls after the first error do nothing, so a section is a
// straight list of reads followed by finish(), which reports keys nobody asked for (typos).
class MapReader {
 public:
  MapReader(const Source& src, const Field& map) : src_(src), map_(map) { open(); }

  const Status& status() const { return status_; }
  bool ok() const { return status_.is_ok(); }
  const Field& self() const { return map_; }

  // The entry for `key`, or nullptr when absent (or after an error). Marks the key as known.
  const Field* take(std::string_view key) {
    if (std::find(known_.begin(), known_.end(), key) == known_.end()) known_.push_back(key);
    if (!ok()) return nullptr;
    for (Entry& e : entries_) {
      if (e.name == key) {
        e.consumed = true;
        return &e.field;
      }
    }
    return nullptr;
  }

  // Runs `read(field)` when the key is present and keeps its first error.
  template <typename Fn>
  void with(std::string_view key, Fn&& read) {
    const Field* f = take(key);
    if (f != nullptr) record(read(*f));
  }

  void u32(std::string_view key, uint64_t min, uint64_t max, uint32_t* out) {
    with(key, [&](const Field& f) {
      uint64_t v = 0;
      Status s = read_uint(src_, f, min, std::min(max, kMaxU32), &v);
      if (s) *out = static_cast<uint32_t>(v);
      return s;
    });
  }
  void port(std::string_view key, uint16_t* out) {
    with(key, [&](const Field& f) {
      uint64_t v = 0;
      Status s = read_uint(src_, f, 1, 65535, &v, "a port number");
      if (s) *out = static_cast<uint16_t>(v);
      return s;
    });
  }
  void ms(std::string_view key, uint64_t min, uint64_t max, std::chrono::milliseconds* out) {
    with(key, [&](const Field& f) {
      uint64_t v = 0;
      Status s = read_uint(src_, f, min, max, &v, "an integer number of milliseconds");
      if (s) *out = std::chrono::milliseconds(static_cast<int64_t>(v));
      return s;
    });
  }
  void str(std::string_view key, size_t max_bytes, std::string* out) {
    with(key, [&](const Field& f) { return read_string(src_, f, max_bytes, out); });
  }
  void boolean(std::string_view key, bool* out) {
    with(key, [&](const Field& f) { return read_bool(src_, f, out); });
  }
  // A name from a fixed set, parsed by `parse` (e.g. proto::parse_role).
  template <typename T>
  void name(std::string_view key, bool (*parse)(std::string_view, T*), std::string_view what,
            std::string_view expected, T* out) {
    with(key, [&](const Field& f) {
      std::string text;
      Status s = read_string(src_, f, kMaxStringBytes, &text);
      if (!s) return s;
      if (!parse(text, out)) {
        return fail(
            src_, f, StatusCode::kInvalidValue,
            fmt::format("unknown {} {} (expected {})", what, quoted_excerpt(text), expected));
      }
      return Status::ok();
    });
  }

  void record(Status s) {
    if (ok() && !s.is_ok()) status_ = std::move(s);
  }

  // Reports the first key no read asked for. Call after every read of the section.
  Status finish() {
    if (!ok()) return status_;
    for (const Entry& e : entries_) {
      if (e.consumed) continue;
      std::string where = map_.path.empty() ? "at top level" : "in " + map_.path;
      return fail_at(src_, e.field.key.Mark(), "", StatusCode::kInvalidValue,
                     fmt::format("unknown key {} {} ({})", quoted_excerpt(e.name), where,
                                 unknown_key_hint(e.name, known_)));
    }
    return Status::ok();
  }

 private:
  struct Entry {
    std::string name;
    Field field;
    bool consumed = false;
  };

  void open() {
    const YAML::Node& n = map_.value;
    if (n.IsNull()) return;  // `section:` written but left empty: all defaults
    if (!n.IsMap()) {
      status_ = fail(src_, map_, StatusCode::kWrongType,
                     fmt::format("expected a map, got {}", describe(n)));
      return;
    }
    for (auto it = n.begin(); it != n.end(); ++it) {
      const YAML::Node key = it->first;  // it-> yields a temporary: copy, do not bind
      if (!key.IsScalar()) {
        status_ = fail_at(src_, key.Mark(), map_.path, StatusCode::kWrongType,
                          fmt::format("keys must be plain names, got {}", describe(key)));
        return;
      }
      const std::string& name = key.Scalar();
      std::string path = map_.path.empty() ? name : map_.path + "." + name;
      for (const Entry& e : entries_) {
        if (e.name == name) {
          status_ =
              fail_at(src_, key.Mark(), path, StatusCode::kInvalidValue,
                      fmt::format("duplicate key (first at line {})", e.field.key.Mark().line + 1));
          return;
        }
      }
      entries_.push_back(Entry{name, Field{key, it->second, std::move(path)}});
    }
  }

  const Source& src_;
  Field map_;
  std::vector<Entry> entries_;
  std::vector<std::string_view> known_;
  Status status_;
};

// ---- addresses --------------------------------------------------------------------------------

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Port text to a number; text longer than 6 digits is out of range anyway.
bool parse_port_number(std::string_view text, uint64_t* out) {
  if (!all_digits(text)) return false;
  if (text.size() > 6) {
    *out = 999999;
    return true;
  }
  std::from_chars(text.data(), text.data() + text.size(), *out);
  return true;
}

// "host:port" where port 0 means "any free port" (tests bind ephemeral ports).
Status parse_listen_address(std::string_view text, proto::HostPort* out) {
  size_t colon = text.rfind(':');
  uint64_t port = 0;
  if (colon != std::string_view::npos && parse_port_number(text.substr(colon + 1), &port)) {
    if (port > 65535) {
      return Status(StatusCode::kOutOfRange,
                    fmt::format("port {} is out of range (1..65535, or 0 for an ephemeral port)",
                                text.substr(colon + 1)));
    }
    if (port == 0) {
      // parse_host_port rejects port 0, so validate the host with a stand-in port.
      std::string with_port = std::string(text.substr(0, colon)) + ":1";
      Status s = proto::parse_host_port(with_port, out);
      if (s) out->port = 0;
      return s;
    }
  }
  return proto::parse_host_port(text, out);
}

// tcp://HOST:PORT, tcp://*:PORT (PORT may be 0 or * for ephemeral) or ipc://PATH.
Status validate_zmq_endpoint(std::string_view text) {
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kIpc = "ipc://";
  if (text.starts_with(kIpc)) {
    std::string_view path = text.substr(kIpc.size());
    constexpr size_t kMaxUnixPath = 107;  // sizeof(sockaddr_un::sun_path) - 1
    if (path.empty()) return Status(StatusCode::kBadAddress, "ipc:// endpoint needs a path");
    if (path.size() > kMaxUnixPath) {
      return Status(StatusCode::kBadAddress,
                    fmt::format("ipc path is {} bytes long (limit {})", path.size(), kMaxUnixPath));
    }
    return Status::ok();
  }
  if (!text.starts_with(kTcp)) {
    return Status(StatusCode::kBadAddress,
                  fmt::format("{} is not a ZMQ endpoint (expected tcp://HOST:PORT, tcp://*:PORT or "
                              "ipc://PATH)",
                              quoted_excerpt(text)));
  }
  std::string_view rest = text.substr(kTcp.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    return Status(StatusCode::kBadAddress, "tcp endpoint needs a port (tcp://HOST:PORT)");
  }
  std::string_view host = rest.substr(0, colon);
  std::string_view port_text = rest.substr(colon + 1);
  if (port_text != "*") {
    uint64_t port = 0;
    if (!parse_port_number(port_text, &port)) {
      return Status(StatusCode::kBadAddress,
                    fmt::format("port {} is not a number or '*'", quoted_excerpt(port_text)));
    }
    if (port > 65535) {
      return Status(
          StatusCode::kOutOfRange,
          fmt::format("port {} is out of range (0..65535; 0 or * = ephemeral)", port_text));
    }
  }
  if (host == "*") return Status::ok();
  std::string parsed;
  return proto::parse_host(host, &parsed);
}

Status address_error(const Source& src, const Field& f, const Status& s) {
  return fail(src, f, s.code(), s.message());
}

// ---- secrets ----------------------------------------------------------------------------------

// Reads at most `limit` bytes of a regular file. O_NONBLOCK keeps a FIFO from hanging the loader.
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

bool is_env_var_name(std::string_view name) {
  if (name.empty() || name.size() > 128 || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// `*_env` key: the named variable must exist and be non-empty. The secret itself never reaches a
// message.
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

void read_file_secret(const Source& src, MapReader& r, std::string_view key, std::string* file,
                      std::string* secret) {
  r.with(key, [&](const Field& f) {
    std::string path;
    Status s = read_string(src, f, 4096, &path);
    if (!s || path.empty()) return s;
    std::string resolved = resolve_beside(src.filename, path);
    std::string content;
    s = read_small_file(resolved, kMaxSecretFileBytes, &content);
    if (!s) return fail(src, f, s.code(), fmt::format("'{}': {}", resolved, s.message()));
    content = strip_trailing_newline(std::move(content));
    if (content.empty())
      return fail(src, f, StatusCode::kInvalidValue, fmt::format("'{}' is empty", resolved));
    if (has_control_chars(content)) {
      return fail(src, f, StatusCode::kInvalidValue,
                  fmt::format("'{}' contains control characters (one line expected)", resolved));
    }
    *file = std::move(path);
    *secret = std::move(content);
    return Status::ok();
  });
}

// ---- sections ---------------------------------------------------------------------------------

Status read_listeners(const Source& src, const Field& f, Topology::Listeners* out) {
  MapReader r(src, f);
  r.with("http", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (s) s = parse_listen_address(text, &out->http);
    return s ? s : address_error(src, v, s);
  });
  r.with("discovery", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (!s) return s;
    s = validate_zmq_endpoint(text);
    if (!s) return address_error(src, v, s);
    out->discovery = std::move(text);
    return s;
  });
  return r.finish();
}

Status read_discovery(const Source& src, const Field& f, Topology::Discovery* out) {
  MapReader r(src, f);
  r.ms("ttl_ms", 1, kDayMs, &out->ttl);
  r.ms("min_ttl_ms", 1, kDayMs, &out->min_ttl);
  r.ms("max_ttl_ms", 1, kDayMs, &out->max_ttl);
  r.ms("expired_retention_ms", 0, kDayMs, &out->expired_retention);
  r.u32("max_instances", 1, 1'000'000, &out->max_instances);
  r.u32("max_message_bytes", 256, 16u << 20, &out->max_message_bytes);
  read_env_secret(src, r, "auth_token_env", &out->auth_token_env, &out->auth_token);
  r.boolean("allow_unauthenticated_vllm", &out->allow_unauthenticated_vllm);
  if (r.ok() && !(out->min_ttl <= out->ttl && out->ttl <= out->max_ttl)) {
    const Field* at = r.take("ttl_ms");
    if (at == nullptr) at = r.take("min_ttl_ms");
    if (at == nullptr) at = r.take("max_ttl_ms");
    r.record(fail(src, at ? *at : f, StatusCode::kOutOfRange,
                  fmt::format("need min_ttl_ms <= ttl_ms <= max_ttl_ms, got {} <= {} <= {}",
                              out->min_ttl.count(), out->ttl.count(), out->max_ttl.count())));
  }
  return r.finish();
}

bool is_http_token(std::string_view s) {
  constexpr std::string_view kSpecials = "!#$%&'*+-.^_`|~";
  return std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           kSpecials.find(c) != std::string_view::npos;
  });
}

Status read_policies(const Source& src, const Field& f, Topology::Policies* out) {
  MapReader r(src, f);
  r.name("prefill", &parse_policy_name, "policy", kPolicyNames, &out->prefill);
  r.name("decode", &parse_policy_name, "policy", kPolicyNames, &out->decode);
  r.with("affinity_header", [&](const Field& v) {
    Status s = read_string(src, v, 256, &out->affinity_header);
    if (s && !is_http_token(out->affinity_header)) {
      return fail(src, v, StatusCode::kInvalidValue, "not a valid HTTP header name");
    }
    return s;
  });
  r.u32("affinity_prefix_bytes", 1, 1u << 20, &out->affinity_prefix_bytes);
  return r.finish();
}

Status read_connectors(const Source& src, const Field& f, Topology::Connectors* out) {
  MapReader r(src, f);
  r.with("default", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (!s) return s;
    proto::Connector c = proto::Connector::kUnknown;
    if (!proto::parse_connector(text, &c) || c == proto::Connector::kUnknown) {
      return fail(
          src, v, StatusCode::kInvalidValue,
          fmt::format("unknown connector {} (expected {})", quoted_excerpt(text), kConnectorNames));
    }
    out->default_connector = c;
    return s;
  });
  r.with("default_transfer_mode", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (!s) return s;
    proto::TransferMode m = proto::TransferMode::kNone;
    if (!proto::parse_transfer_mode(text, &m) || m == proto::TransferMode::kNone) {
      return fail(
          src, v, StatusCode::kInvalidValue,
          fmt::format("unknown transfer mode {} (expected READ or WRITE)", quoted_excerpt(text)));
    }
    out->default_transfer_mode = m;
    return s;
  });
  r.port("mooncake_bootstrap_port", &out->mooncake_bootstrap_port);
  read_env_secret(src, r, "upstream_api_key_env", &out->upstream_api_key_env,
                  &out->upstream_api_key);
  return r.finish();
}

Status read_timeouts(const Source& src, const Field& f, Topology::Timeouts* out) {
  MapReader r(src, f);
  r.ms("connect_ms", 1, 10 * 60 * 1000, &out->connect);
  r.ms("prefill_ms", 1, kDayMs, &out->prefill);
  r.ms("first_byte_ms", 1, kDayMs, &out->first_byte);
  r.ms("stream_idle_ms", 1, kDayMs, &out->stream_idle);
  r.ms("header_read_ms", 1, kDayMs, &out->header_read);
  r.ms("keep_alive_idle_ms", 1, kDayMs, &out->keep_alive_idle);
  r.ms("drain_ms", 0, kDayMs, &out->drain);
  return r.finish();
}

Status read_retries(const Source& src, const Field& f, Topology::Retries* out) {
  MapReader r(src, f);
  r.u32("prefill_attempts", 1, 16, &out->prefill_attempts);
  r.u32("decode_attempts", 1, 16, &out->decode_attempts);
  return r.finish();
}

Status read_limits(const Source& src, const Field& f, Topology::Limits* out) {
  MapReader r(src, f);
  r.u32("max_body_bytes", 1, 1u << 31, &out->max_body_bytes);
  r.u32("max_header_bytes", 1024, 16u << 20, &out->max_header_bytes);
  r.u32("max_concurrent_requests", 1, 10'000'000, &out->max_concurrent_requests);
  r.u32("max_connections", 1, 10'000'000, &out->max_connections);
  return r.finish();
}

Status read_admin(const Source& src, const Field& f, Topology::Admin* out) {
  MapReader r(src, f);
  read_env_secret(src, r, "api_key_env", &out->api_key_env, &out->api_key);
  read_file_secret(src, r, "api_key_file", &out->api_key_file, &out->api_key);
  if (r.ok() && !out->api_key_env.empty() && !out->api_key_file.empty()) {
    r.record(fail(src, *r.take("api_key_file"), StatusCode::kInvalidValue,
                  "set api_key_env or api_key_file, not both"));
  }
  return r.finish();
}

Status read_labels(const Source& src, const Field& f, proto::Labels* out) {
  if (f.value.IsNull()) return Status::ok();
  if (!f.value.IsMap()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a map of labels, got {}", describe(f.value)));
  }
  MapReader r(src, f);
  if (!r.ok()) return r.status();
  std::map<std::string, std::string> sorted;
  for (auto it = f.value.begin(); it != f.value.end(); ++it) {
    const std::string key = it->first.Scalar();
    Field entry{it->first, it->second, f.path + "." + key};
    if (key.empty() || key.size() > kMaxLabelKeyBytes || has_control_chars(key)) {
      return fail_at(src, it->first.Mark(), f.path, StatusCode::kInvalidValue,
                     fmt::format("label key must be 1..{} printable bytes", kMaxLabelKeyBytes));
    }
    std::string value;
    Status s = read_string(src, entry, kMaxLabelValueBytes, &value);
    if (!s) return s;
    sorted.emplace(key, std::move(value));
  }
  if (sorted.size() > kMaxLabels) {
    return fail(src, f, StatusCode::kTooLarge,
                fmt::format("{} labels (limit {})", sorted.size(), kMaxLabels));
  }
  out->assign(sorted.begin(), sorted.end());
  return Status::ok();
}

// zmq_address rules depend on the connector: MoRIIO needs its composite form and a transfer mode,
// P2P-NCCL a plain host:port; other connectors carry it verbatim.
Status check_connector_fields(const Source& src, MapReader& r, const Topology::Connectors& defaults,
                              StaticInstance* inst) {
  const Field* zmq = r.take("zmq_address");
  const Field* mode = r.take("transfer_mode");
  const Field& where = r.self();
  switch (inst->connector) {
    case proto::Connector::kMoriio: {
      if (zmq == nullptr) {
        return fail(src, where, StatusCode::kMissingKey,
                    "connector moriio needs zmq_address (\"host:IP,handshake:PORT,notify:PORT\")");
      }
      proto::MoriioZmqAddress parsed;
      Status s = proto::parse_moriio_zmq_address(inst->zmq_address, &parsed);
      if (!s) return address_error(src, *zmq, s);
      if (mode == nullptr) inst->transfer_mode = defaults.default_transfer_mode;
      if (inst->transfer_mode == proto::TransferMode::kNone) {
        return fail(src, mode ? *mode : where, StatusCode::kInvalidValue,
                    "connector moriio needs transfer_mode READ or WRITE");
      }
      return Status::ok();
    }
    case proto::Connector::kP2pNccl: {
      if (zmq == nullptr) {
        return fail(src, where, StatusCode::kMissingKey,
                    "connector p2p-nccl needs zmq_address (\"host:port\")");
      }
      proto::HostPort parsed;
      Status s = proto::parse_host_port(inst->zmq_address, &parsed);
      if (!s) return address_error(src, *zmq, s);
      if (inst->transfer_mode != proto::TransferMode::kNone) {
        return fail(src, *mode, StatusCode::kInvalidValue,
                    "connector p2p-nccl has no transfer mode");
      }
      return Status::ok();
    }
    case proto::Connector::kMooncake:
      if (inst->role == proto::Role::kPrefill && !inst->bootstrap_port) {
        inst->bootstrap_port = defaults.mooncake_bootstrap_port;
      }
      return Status::ok();
    default:
      return Status::ok();
  }
}

Status read_instance(const Source& src, const Field& f, const Topology::Connectors& defaults,
                     StaticInstance* out) {
  if (!f.value.IsMap()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a map describing an instance, got {}", describe(f.value)));
  }
  StaticInstance inst;
  inst.connector = defaults.default_connector;
  MapReader r(src, f);
  bool has_role = false;
  bool has_http = false;
  r.with("role", [&](const Field& v) {
    has_role = true;
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (s && !proto::parse_role(text, &inst.role)) {
      return fail(
          src, v, StatusCode::kInvalidValue,
          fmt::format("unknown role {} (expected prefill or decode)", quoted_excerpt(text)));
    }
    return s;
  });
  r.with("http_address", [&](const Field& v) {
    has_http = true;
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (s) s = proto::parse_host_port(text, &inst.http_address);
    return s ? s : address_error(src, v, s);
  });
  r.with("connector", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (s && (!proto::parse_connector(text, &inst.connector) ||
              inst.connector == proto::Connector::kUnknown)) {
      return fail(
          src, v, StatusCode::kInvalidValue,
          fmt::format("unknown connector {} (expected {})", quoted_excerpt(text), kConnectorNames));
    }
    return s;
  });
  r.with("transfer_mode", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (s && !proto::parse_transfer_mode(text, &inst.transfer_mode)) {
      return fail(src, v, StatusCode::kInvalidValue,
                  fmt::format("unknown transfer mode {} (expected READ, WRITE or none)",
                              quoted_excerpt(text)));
    }
    return s;
  });
  r.str("zmq_address", kMaxStringBytes, &inst.zmq_address);
  r.u32("dp_size", 1, 1024, &inst.dp_size);
  r.u32("tp_size", 1, 1024, &inst.tp_size);
  r.with("bootstrap_port", [&](const Field& v) {
    uint64_t port = 0;
    Status s = read_uint(src, v, 1, 65535, &port, "a port number");
    if (s) inst.bootstrap_port = static_cast<uint16_t>(port);
    return s;
  });
  r.str("model", kMaxStringBytes, &inst.model);
  r.with("labels", [&](const Field& v) { return read_labels(src, v, &inst.labels); });
  if (r.ok() && !has_role)
    r.record(fail(src, f, StatusCode::kMissingKey, "missing key 'role' (prefill or decode)"));
  if (r.ok() && !has_http)
    r.record(fail(src, f, StatusCode::kMissingKey, "missing key 'http_address' (host:port)"));
  if (r.ok()) r.record(check_connector_fields(src, r, defaults, &inst));
  Status s = r.finish();
  if (s) *out = std::move(inst);
  return s;
}

Status read_instances(const Source& src, const Field& f, const Topology::Connectors& defaults,
                      std::vector<StaticInstance>* out) {
  if (f.value.IsNull()) return Status::ok();
  if (!f.value.IsSequence()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a list of instances, got {}", describe(f.value)));
  }
  std::vector<StaticInstance> list;
  std::map<std::string, size_t> index_by_address;
  size_t i = 0;
  for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
    Field item{YAML::Node(), *it, fmt::format("{}[{}]", f.path, i)};
    StaticInstance inst;
    Status s = read_instance(src, item, defaults, &inst);
    if (!s) return s;
    auto [prev, inserted] = index_by_address.emplace(inst.http_address.to_string(), i);
    if (!inserted) {
      const YAML::Node addr = (*it)["http_address"];
      return fail_at(
          src, addr.Mark(), item.path + ".http_address", StatusCode::kInvalidValue,
          fmt::format("duplicate instance {} (also {}[{}])", prev->first, f.path, prev->second));
    }
    list.push_back(std::move(inst));
  }
  *out = std::move(list);
  return Status::ok();
}

Status read_workers(const Source& src, const Field& f, uint32_t* out) {
  uint64_t v = 0;
  Status s = read_uint(src, f, 0, kMaxWorkers, &v);
  if (s) *out = static_cast<uint32_t>(v);
  return s;
}

Status read_topology(const Source& src, const YAML::Node& root, Topology* out) {
  Topology t;
  MapReader r(src, Field{YAML::Node(), root, ""});
  r.with("listeners", [&](const Field& f) { return read_listeners(src, f, &t.listeners); });
  r.with("workers", [&](const Field& f) { return read_workers(src, f, &t.workers); });
  r.with("discovery", [&](const Field& f) { return read_discovery(src, f, &t.discovery); });
  r.with("policies", [&](const Field& f) { return read_policies(src, f, &t.policies); });
  r.with("connectors", [&](const Field& f) { return read_connectors(src, f, &t.connectors); });
  r.with("timeouts", [&](const Field& f) { return read_timeouts(src, f, &t.timeouts); });
  r.with("retries", [&](const Field& f) { return read_retries(src, f, &t.retries); });
  r.with("limits", [&](const Field& f) { return read_limits(src, f, &t.limits); });
  r.with("admin", [&](const Field& f) { return read_admin(src, f, &t.admin); });
  // After connectors: instance defaults come from there.
  r.with("instances",
         [&](const Field& f) { return read_instances(src, f, t.connectors, &t.static_instances); });
  Status s = r.finish();
  if (s) *out = std::move(t);
  return s;
}

Status too_many_nodes(const Source& src, const YAML::Mark& mark) {
  return fail_at(
      src, mark, "", StatusCode::kTooLarge,
      fmt::format("document has more than {} nodes (aliases count each time they are used)",
                  kMaxNodes));
}

Status too_deep(const Source& src, const YAML::Mark& mark) {
  return fail_at(src, mark, "", StatusCode::kTooDeep,
                 fmt::format("nesting is deeper than {} levels", kMaxDepth));
}

// First pass over the parser's events, before any tree is built: building yaml-cpp nodes for a
// 1 MiB flat list takes seconds and hundreds of MiB, counting its events stops after kMaxNodes.
// An alias counts as the size of the subtree its anchor named, so billion-laughs documents are
// measured as they would expand.
class NodeBudget : public YAML::EventHandler {
 public:
  struct Exceeded {
    YAML::Mark mark;
    bool depth;  // else node count
  };

  void OnDocumentStart(const YAML::Mark&) override { anchor_sizes_.clear(); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    add(mark, anchor < anchor_sizes_.size() ? anchor_sizes_[anchor] : 1);
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                const std::string&) override {
    leaf(mark, anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Open {
    YAML::anchor_t anchor;
    size_t count_before;
  };

  void add(const YAML::Mark& mark, size_t n) {
    nodes_ += n;
    if (nodes_ > kMaxNodes) throw Exceeded{mark, false};
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (open_.size() + 1 > kMaxDepth) throw Exceeded{mark, true};
    add(mark, 1);
    remember(anchor, 1);
  }
  void open(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (open_.size() + 1 > kMaxDepth) throw Exceeded{mark, true};
    open_.push_back(Open{anchor, nodes_});
    add(mark, 1);
  }
  void close() {
    Open o = open_.back();
    open_.pop_back();
    remember(o.anchor, nodes_ - o.count_before);
  }
  void remember(YAML::anchor_t anchor, size_t size) {
    if (anchor == YAML::NullAnchor) return;
    // Anchor ids count up from 1 within a document, so this grows with the node count only.
    if (anchor >= anchor_sizes_.size()) anchor_sizes_.resize(anchor + 1, 1);
    anchor_sizes_[anchor] = size;
  }

  size_t nodes_ = 0;
  std::vector<Open> open_;
  std::vector<size_t> anchor_sizes_;
};

Status check_event_budget(const Source& src, const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  NodeBudget budget;
  try {
    while (parser.HandleNextDocument(budget)) {
    }
  } catch (const NodeBudget::Exceeded& e) {
    return e.depth ? too_deep(src, e.mark) : too_many_nodes(src, e.mark);
  }
  return Status::ok();
}

// Second line of defence on the built tree, where aliases share nodes: every visit counts, so
// depth reached through aliases is caught too and the walk itself stays bounded.
Status check_tree_size(const Source& src, const YAML::Node& n, size_t depth, size_t* nodes) {
  if (++*nodes > kMaxNodes) return too_many_nodes(src, n.Mark());
  if (depth > kMaxDepth) return too_deep(src, n.Mark());
  if (n.IsMap()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      Status s = check_tree_size(src, it->first, depth + 1, nodes);
      if (s) s = check_tree_size(src, it->second, depth + 1, nodes);
      if (!s) return s;
    }
  } else if (n.IsSequence()) {
    for (auto it = n.begin(); it != n.end(); ++it) {
      Status s = check_tree_size(src, *it, depth + 1, nodes);
      if (!s) return s;
    }
  }
  return Status::ok();
}

Status parse_text(const Source& src, std::string_view yaml_text, Topology* out) {
  const std::string text(yaml_text);
  Status s = check_event_budget(src, text);
  if (!s) return s;
  std::vector<YAML::Node> docs = YAML::LoadAll(text);
  if (docs.empty()) {
    *out = Topology{};
    return Status::ok();
  }
  if (docs.size() > 1) {
    return fail_at(src, docs[1].Mark(), "", StatusCode::kInvalidValue,
                   "more than one YAML document (only one topology per file)");
  }
  size_t nodes = 0;
  s = check_tree_size(src, docs[0], 1, &nodes);
  if (!s) return s;
  if (!docs[0].IsNull() && !docs[0].IsMap()) {
    return fail_at(src, docs[0].Mark(), "", StatusCode::kWrongType,
                   fmt::format("top level must be a map, got {}", describe(docs[0])));
  }
  return read_topology(src, docs[0], out);
}

}  // namespace

Status parse_topology(std::string_view yaml_text, std::string_view filename, Topology* out) {
  Source src{filename.empty() ? std::string("<topology>") : std::string(filename)};
  if (yaml_text.size() > kMaxFileBytes) {
    return Status(StatusCode::kTooLarge,
                  fmt::format("{}: topology is {} bytes (limit {})", src.filename, yaml_text.size(),
                              kMaxFileBytes));
  }
  try {
    return parse_text(src, yaml_text, out);
  } catch (const YAML::DeepRecursion& e) {
    return fail_at(src, e.mark, "", StatusCode::kTooDeep, "invalid YAML: nesting is too deep");
  } catch (const YAML::ParserException& e) {
    return fail_at(src, e.mark, "", StatusCode::kMalformed, "invalid YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    return fail_at(src, e.mark, "", StatusCode::kInvalidValue, e.msg);
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, fmt::format("{}: {}", src.filename, e.what()));
  }
}

Status load_topology_file(const std::string& path, Topology* out) {
  std::string text;
  Status s = read_small_file(path, kMaxFileBytes, &text);
  if (!s) return Status(s.code(), fmt::format("{}: {}", path, s.message()));
  Topology t;
  s = parse_topology(text, path, &t);
  if (!s) return s;
  t.source_path = path;
  *out = std::move(t);
  return Status::ok();
}

}  // namespace pdr::discovery
