#include "discovery/config/topology_tls.h"

#include <charconv>
#include <string>
#include <string_view>

#include "discovery/config/topology_secrets.h"

namespace pdr::config {

namespace {

using yaml::fail;
using yaml::Field;
using yaml::MapReader;
using yaml::quoted_excerpt;
using yaml::read_string;
using yaml::Source;

// A certificate bundle or key is small; the cap only keeps a wrong path (a log file) out.
constexpr size_t kMaxPemBytes = 1 << 20;

// Reads `key` as a PEM file that must hold `block` ("CERTIFICATE-----", "PRIVATE KEY-----");
// OpenSSL parses it fully when the context is built (router/tls_contexts.h).
void read_pem(const Source& src, MapReader& r, std::string_view key, std::string_view block, std::string* file,
              std::string* content) {
  std::string path;
  read_text_file(src, r, key, kMaxPemBytes, &path, [&, block](const Field& at, std::string_view text) {
    if (text.find(block) == std::string_view::npos) {
      return fail(src, at, StatusCode::kInvalidValue, fmt::format("'{}' holds no PEM {}", path, block));
    }
    *file = path;
    *content = std::string(text);
    return Status::ok();
  });
}

}  // namespace

const NodeTls& Topology::Connectors::tls_for(const proto::HostPort& http_address) const {
  for (const NodeTlsOverride& o : tls_by_node) {
    if (o.http_address == http_address) return o.tls;
  }
  return tls;
}

Status read_listener_tls(const Source& src, const Field& f, ListenerTls* out) {
  ListenerTls tls;
  MapReader r(src, f);
  read_pem(src, r, "cert_file", "CERTIFICATE-----", &tls.cert_file, &tls.cert_pem);
  read_pem(src, r, "key_file", "PRIVATE KEY-----", &tls.key_file, &tls.key_pem);
  read_pem(src, r, "client_ca_file", "CERTIFICATE-----", &tls.client_ca_file, &tls.client_ca_pem);
  Status s = r.finish();
  if (!s) return s;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return fail(src, f, StatusCode::kMissingKey, "cert_file and key_file go together");
  }
  if (tls.cert_file.empty() && !tls.client_ca_file.empty()) {
    return fail(src, f, StatusCode::kMissingKey, "client_ca_file needs cert_file and key_file (TLS on)");
  }
  *out = std::move(tls);
  return Status::ok();
}

Status read_node_tls(const Source& src, const Field& f, NodeTls* out) {
  NodeTls tls = *out;
  tls.enabled = true;
  MapReader r(src, f);
  r.boolean("enabled", &tls.enabled);
  read_pem(src, r, "ca_file", "CERTIFICATE-----", &tls.ca_file, &tls.ca_pem);
  read_pem(src, r, "cert_file", "CERTIFICATE-----", &tls.cert_file, &tls.cert_pem);
  read_pem(src, r, "key_file", "PRIVATE KEY-----", &tls.key_file, &tls.key_pem);
  r.with("server_name", [&](const Field& v) {
    Status s = read_string(src, v, 253, &tls.server_name);
    if (s && tls.server_name.find_first_of(" /@[]") != std::string::npos) {
      return fail(src, v, StatusCode::kInvalidValue,
                  fmt::format("{} is not a host name or an IP address", quoted_excerpt(tls.server_name)));
    }
    return s;
  });
  Status s = r.finish();
  if (!s) return s;
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return fail(src, f, StatusCode::kMissingKey, "cert_file and key_file go together (mutual TLS)");
  }
  *out = std::move(tls);
  return Status::ok();
}

Status read_tracing(const Source& src, const Field& f, Topology::Tracing* out) {
  Topology::Tracing t;
  MapReader r(src, f);
  r.with("endpoint", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, 512, &text);
    if (!s || text.empty()) return s;
    if (!text.starts_with("http://")) {
      return fail(src, v, StatusCode::kInvalidValue,
                  "expected http://host:port/path (an OTLP/HTTP collector, e.g. http://127.0.0.1:4318/v1/traces)");
    }
    const std::string rest = text.substr(7);
    const size_t slash = rest.find('/');
    const std::string authority = rest.substr(0, slash);
    t.collector_path = slash == std::string::npos ? "/v1/traces" : rest.substr(slash);
    if (t.collector_path.find_first_of(" ?#") != std::string::npos) {
      return fail(src, v, StatusCode::kInvalidValue, "the path must not hold spaces, '?' or '#'");
    }
    s = proto::parse_host_port(authority, &t.collector);
    if (!s) return fail(src, v, s.code(), s.message());
    t.endpoint = std::move(text);
    return Status::ok();
  });
  r.with("sampling_ratio", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, 32, &text);
    if (!s) return s;
    double ratio = -1;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), ratio);
    if (ec != std::errc() || end != text.data() + text.size() || !(ratio >= 0.0 && ratio <= 1.0)) {
      return fail(src, v, StatusCode::kOutOfRange,
                  fmt::format("expected a number from 0 to 1, got {}", quoted_excerpt(text)));
    }
    t.sampling_ratio = ratio;
    return Status::ok();
  });
  r.with("service_name", [&](const Field& v) {
    Status s = read_string(src, v, 128, &t.service_name);
    if (s && t.service_name.empty()) return fail(src, v, StatusCode::kInvalidValue, "must not be empty");
    return s;
  });
  r.u32("max_queue_spans", 16, 1'000'000, &t.max_queue_spans);
  r.ms("batch_ms", 10, 60'000, &t.batch);
  r.u32("max_batch_spans", 1, 10'000, &t.max_batch_spans);
  r.ms("export_timeout_ms", 10, 60'000, &t.export_timeout);
  Status s = r.finish();
  if (!s) return s;
  *out = std::move(t);
  return Status::ok();
}

}  // namespace pdr::config
