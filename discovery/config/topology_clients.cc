// Readers of the client sections (contracts in topology_clients.h) and Tenants::limits_of.
#include "discovery/config/topology_clients.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <algorithm>

#include "discovery/config/topology_secrets.h"

namespace pdr::config {

using yaml::fail;
using yaml::Field;
using yaml::MapReader;
using yaml::quoted_excerpt;
using yaml::read_string;
using yaml::Source;

namespace {

// A key file of kMaxClientKeys digest lines fits with room to spare.
constexpr size_t kMaxKeyFileBytes = 8u << 20;

bool is_header_name(std::string_view s) {
  constexpr std::string_view kSpecials = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           kSpecials.find(c) != std::string_view::npos;
  });
}

Status read_limits(const Source& src, const Field& f, Topology::TenantLimits* out) {
  MapReader r(src, f);
  r.u32("requests_per_second", 0, 1'000'000, &out->requests_per_second);
  r.u32("burst", 0, 1'000'000, &out->burst);
  r.u32("tokens_per_minute", 0, 1'000'000'000, &out->tokens_per_minute);
  r.u32("max_in_flight", 0, 10'000'000, &out->max_in_flight);
  r.u32("priority", 0, 7, &out->priority);
  return r.finish();
}

}  // namespace

const Topology::TenantLimits& Topology::Tenants::limits_of(std::string_view tenant) const {
  auto it = std::lower_bound(limits.begin(), limits.end(), tenant,
                             [](const auto& entry, std::string_view name) { return entry.first < name; });
  return it != limits.end() && it->first == tenant ? it->second : defaults;
}

Status read_client_auth(const Source& src, const Field& f, Topology::ClientAuth* out) {
  MapReader r(src, f);
  read_text_file(src, r, "keys_file", kMaxKeyFileBytes, &out->keys_file, [&](const Field& at, std::string_view text) {
    Status s = parse_client_key_file(text, &out->keys);
    // The text is read_text_file's buffer, released when this returns: its keys are wiped first.
    OPENSSL_cleanse(const_cast<char*>(text.data()), text.size());
    return s ? s : fail(src, at, s.code(), fmt::format("'{}': {}", out->keys_file, s.message()));
  });
  if (!out->keys_file.empty()) {
    const size_t slash = src.filename.rfind('/');
    out->keys_path = out->keys_file.front() == '/' || slash == std::string::npos
                         ? out->keys_file
                         : src.filename.substr(0, slash + 1) + out->keys_file;
  }
  r.boolean("forward_client_key", &out->forward_client_key);
  return r.finish();
}

Status read_tenants(const Source& src, const Field& f, Topology::Tenants* out) {
  MapReader r(src, f);
  r.with("header", [&](const Field& v) {
    std::string name;
    Status s = read_string(src, v, 256, &name);
    if (!s || name.empty()) return s;
    if (!is_header_name(name)) return fail(src, v, StatusCode::kInvalidValue, "not a valid HTTP header name");
    std::transform(name.begin(), name.end(), name.begin(),
                   [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; });
    out->header = std::move(name);
    return s;
  });
  r.with("defaults", [&](const Field& v) { return read_limits(src, v, &out->defaults); });
  // After defaults: an entry's unwritten fields are the defaults' values.
  r.with("limits", [&](const Field& v) {
    if (v.value.IsNull()) return Status::ok();
    if (!v.value.IsMap()) {
      return fail(src, v, StatusCode::kWrongType,
                  fmt::format("expected a map of tenant names to limits, got {}", yaml::describe(v.value)));
    }
    std::vector<std::pair<std::string, Topology::TenantLimits>> limits;
    for (auto it = v.value.begin(); it != v.value.end(); ++it) {
      const std::string name = it->first.Scalar();
      Field entry{it->first, it->second, v.path + "." + name};
      if (!is_tenant_name(name) || name == kOtherTenant) {
        return yaml::fail_at(src, it->first.Mark(), v.path, StatusCode::kInvalidValue,
                             fmt::format("{} is not a tenant name (1 to {} of A-Z a-z 0-9 . _ -, not 'other')",
                                         quoted_excerpt(name), kMaxTenantNameBytes));
      }
      Topology::TenantLimits l = out->defaults;
      if (Status s = read_limits(src, entry, &l); !s) return s;
      limits.emplace_back(name, l);
    }
    if (limits.size() > kMaxTenants) {
      return fail(src, v, StatusCode::kTooLarge, fmt::format("{} tenants (at most {})", limits.size(), kMaxTenants));
    }
    std::sort(limits.begin(), limits.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 1; i < limits.size(); ++i) {
      if (limits[i].first == limits[i - 1].first) {
        return fail(src, v, StatusCode::kInvalidValue, fmt::format("tenant '{}' is listed twice", limits[i].first));
      }
    }
    out->limits = std::move(limits);
    return Status::ok();
  });
  return r.finish();
}

Status read_access_log(const Source& src, const Field& f, Topology::AccessLog* out) {
  MapReader r(src, f);
  r.with("path", [&](const Field& v) {
    std::string path;
    Status s = read_string(src, v, 4096, &path);
    if (!s) return s;
    if (!path.empty() && path != "stderr" && path.front() != '/') {
      return fail(src, v, StatusCode::kInvalidValue,
                  fmt::format("expected an absolute path or stderr, got {}", quoted_excerpt(path)));
    }
    out->path = std::move(path);
    return s;
  });
  r.u32("max_queued_lines", 16, 1'000'000, &out->max_queued_lines);
  return r.finish();
}

}  // namespace pdr::config
