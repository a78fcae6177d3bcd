// Topology YAML -> validated plain structs: the schema (which sections and keys exist, their
// ranges, cross-field rules). Generic YAML reading is in yaml_reader.h, secret resolution in
// topology_secrets.h, listener address checks in topology_addresses.h. Every yaml-cpp exception is
// caught here and becomes a Status whose message starts with FILE:LINE:COL.
#include <fmt/format.h>
#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <climits>
#include <exception>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/log.h"
#include "discovery/config/instance_spec.h"
#include "discovery/config/topology.h"
#include "discovery/config/topology_addresses.h"
#include "discovery/config/topology_clients.h"
#include "discovery/config/topology_secrets.h"
#include "discovery/config/topology_tls.h"
#include "discovery/config/topology_warnings.h"
#include "discovery/config/yaml_reader.h"

namespace pdr::config {

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
    case PolicyName::kCacheAware:
      return "cache_aware";
    case PolicyName::kPredictedLatency:
      return "predicted_latency";
  }
  return "unknown";
}

bool parse_policy_name(std::string_view text, PolicyName* out) {
  for (PolicyName p : {PolicyName::kRoundRobin, PolicyName::kLeastOutstanding,
                       PolicyName::kPowerOfTwo, PolicyName::kAffinity, PolicyName::kCacheAware,
                       PolicyName::kPredictedLatency}) {
    if (text == to_string(p)) {
      *out = p;
      return true;
    }
  }
  return false;
}

namespace {

using yaml::describe;
using yaml::fail;
using yaml::fail_at;
using yaml::Field;
using yaml::has_control_chars;
using yaml::kMaxStringBytes;
using yaml::MapReader;
using yaml::quoted_excerpt;
using yaml::read_string;
using yaml::read_uint;
using yaml::Source;

constexpr size_t kMaxFileBytes = 1 << 20;
constexpr uint64_t kMaxWorkers = 256;
constexpr uint64_t kDayMs = 24ull * 3600 * 1000;
constexpr std::string_view kPolicyNames =
    "round_robin, least_outstanding, power_of_two, affinity, cache_aware, predicted_latency";

// Parsers outside this file (addresses, instance_spec.h names) report no position of their own;
// point their Status at the value parsed.
Status at_value(const Source& src, const Field& f, const Status& s) {
  return fail(src, f, s.code(), s.message());
}

// A string value turned into T by one of those parsers.
template <typename T>
Status read_parsed(const Source& src, const Field& v, Status (*parse)(std::string_view, T*), T* out) {
  std::string text;
  Status s = read_string(src, v, kMaxStringBytes, &text);
  if (!s) return s;  // already positioned
  s = parse(text, out);
  return s ? s : at_value(src, v, s);
}

// ---- sections ---------------------------------------------------------------------------------

Status read_listeners(const Source& src, const Field& f, Topology::Listeners* out) {
  MapReader r(src, f);
  r.with("http", [&](const Field& v) { return read_parsed(src, v, &parse_listen_address, &out->http); });
  r.with("admin", [&](const Field& v) {
    proto::HostPort hp;
    Status s = read_parsed(src, v, &parse_listen_address, &hp);
    if (s) out->admin = hp;
    return s;
  });
  r.with("discovery", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (!s) return s;
    s = validate_zmq_endpoint(text);
    if (!s) return at_value(src, v, s);
    out->discovery = std::move(text);
    return s;
  });
  r.with("discovery_curve", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, kMaxStringBytes, &text);
    if (!s || text.empty()) return s;
    s = validate_zmq_endpoint(text);
    if (!s) return at_value(src, v, s);
    out->discovery_curve = std::move(text);
    return s;
  });
  r.with("tls", [&](const Field& v) { return read_listener_tls(src, v, &out->tls); });
  r.with("admin_tls", [&](const Field& v) { return read_listener_tls(src, v, &out->admin_tls); });
  Status s = r.finish();
  if (s && out->admin_tls.enabled() && !out->admin) {
    return fail(src, f, StatusCode::kMissingKey, "admin_tls needs listeners.admin (the operator listener)");
  }
  return s;
}

Status read_allowed_peers(const Source& src, const Field& f, AllowList* out) {
  if (!f.value.IsSequence()) {
    return fail(src, f, StatusCode::kWrongType,
                fmt::format("expected a list of CIDRs (e.g. [\"10.0.0.0/8\"]), got {}", describe(f.value)));
  }
  AllowList list;
  size_t i = 0;
  for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
    Field item{YAML::Node(), *it, fmt::format("{}[{}]", f.path, i)};
    std::string text;
    Status s = read_string(src, item, 64, &text);
    if (!s) return s;
    Cidr cidr;
    s = parse_cidr(text, &cidr);
    if (!s) return at_value(src, item, s);
    list.cidrs.push_back(cidr);
  }
  *out = std::move(list);
  return Status::ok();
}

Status read_class_caps(const Source& src, const Field& f, std::array<uint32_t, kAdmissionClasses>* out) {
  MapReader r(src, f);
  for (size_t c = 0; c < kAdmissionClasses; ++c) {
    r.u32(to_string(static_cast<AdmissionClass>(c)), 0, 1'000'000, &(*out)[c]);
  }
  return r.finish();
}

Status read_curve(const Source& src, const Field& f, Topology::Discovery::Curve* out) {
  MapReader r(src, f);
  read_text_file(src, r, "secret_key_file", 64 * 1024, &out->secret_key_file, [&](const Field& at, std::string_view text) {
    Status s = proto::parse_curve_secret_key(text, &out->server_keys);
    return s ? s : fail(src, at, s.code(), fmt::format("'{}': {}", out->secret_key_file, s.message()));
  });
  read_text_file(src, r, "allowed_client_keys_file", 8 << 20, &out->allowed_client_keys_file,
                 [&](const Field& at, std::string_view text) {
                   Status s = proto::parse_curve_public_keys(text, &out->allowed_client_keys);
                   if (s && out->allowed_client_keys.empty()) {
                     s = Status(StatusCode::kInvalidValue, "holds no key (an empty list would admit no sidecar)");
                   }
                   return s ? s : fail(src, at, s.code(), fmt::format("'{}': {}", out->allowed_client_keys_file, s.message()));
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
  r.with("allowed_peers", [&](const Field& v) { return read_allowed_peers(src, v, &out->allowed_peers); });
  r.boolean("allow_open", &out->allow_open);
  // Caps not given follow max_instances (open: at most 256 of them).
  constexpr uint32_t kUnset = UINT32_MAX;
  std::array<uint32_t, kAdmissionClasses> caps;
  caps.fill(kUnset);
  r.with("max_instances_per_class", [&](const Field& v) { return read_class_caps(src, v, &caps); });
  r.with("curve", [&](const Field& v) { return read_curve(src, v, &out->curve); });
  for (size_t c = 0; c < kAdmissionClasses; ++c) {
    if (caps[c] != kUnset) {
      out->max_instances_per_class[c] = caps[c];
    } else {
      out->max_instances_per_class[c] =
          c == static_cast<size_t>(AdmissionClass::kOpen) ? std::min(256u, out->max_instances) : out->max_instances;
    }
  }
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
  r.with("cache_aware", [&](const Field& v) {
    MapReader c(src, v);
    Topology::Policies::CacheAware& ca = out->cache_aware;
    c.u32("min_match_percent", 1, 100, &ca.min_match_percent);
    c.u32("balance_abs_threshold", 0, 1u << 20, &ca.balance_abs_threshold);
    c.u32("balance_rel_percent", 100, 100'000, &ca.balance_rel_percent);
    c.u32("prefix_tree_max_bytes", 1u << 16, 1u << 31, &ca.prefix_tree_max_bytes);
    c.u32("prefix_tree_prompt_bytes", 64, 1u << 20, &ca.prefix_tree_prompt_bytes);
    c.with("tokenize", [&](const Field& t) {
      std::string text;
      Status s = read_string(src, t, kMaxStringBytes, &text);
      if (!s) return s;
      if (text != "off" && text != "node") {
        return fail(src, t, StatusCode::kInvalidValue,
                    fmt::format("unknown tokenize mode {} (expected off or node)", quoted_excerpt(text)));
      }
      ca.tokenize_by_node = text == "node";
      return s;
    });
    c.ms("tokenize_timeout_ms", 1, 60'000, &ca.tokenize_timeout);
    c.u32("tokenize_max_answer_bytes", 1024, 64u << 20, &ca.tokenize_max_answer_bytes);
    return c.finish();
  });
  r.with("predicted_latency", [&](const Field& v) {
    MapReader c(src, v);
    Topology::Policies::PredictedLatency& pl = out->predicted_latency;
    c.u32("default_prefill_tokens_per_second", 1, 100'000'000, &pl.default_prefill_tokens_per_second);
    c.u32("default_decode_step_us", 1, 10'000'000, &pl.default_decode_step_us);
    c.u32("decode_step_us_per_sequence", 0, 1'000'000, &pl.decode_step_us_per_sequence);
    c.u32("decode_step_ns_per_kv_token", 0, 1'000'000, &pl.decode_step_ns_per_kv_token);
    c.u32("kv_transfer_ns_per_token", 0, 100'000'000, &pl.kv_transfer_ns_per_token);
    c.u32("kv_capacity_tokens", 1, 1u << 31, &pl.kv_capacity_tokens);
    c.u32("kv_full_penalty_ms", 0, 3'600'000, &pl.kv_full_penalty_ms);
    c.u32("fleet_work_weight", 0, 1000, &pl.fleet_work_weight);
    c.u32("step_token_budget", 1, 1u << 24, &pl.step_token_budget);
    c.with("prefill_rate", [&](const Field& t) {
      std::string text;
      Status s = read_string(src, t, kMaxStringBytes, &text);
      if (!s) return s;
      if (text != "fleet" && text != "node") {
        return fail(src, t, StatusCode::kInvalidValue,
                    fmt::format("unknown prefill_rate {} (expected fleet or node)", quoted_excerpt(text)));
      }
      pl.prefill_rate_per_node = text == "node";
      return s;
    });
    c.u32("slo_ttft_ms", 0, 3'600'000, &pl.slo_ttft_ms);
    c.u32("slo_tpot_ms", 0, 60'000, &pl.slo_tpot_ms);
    c.boolean("shed", &pl.shed);
    return c.finish();
  });
  return r.finish();
}

Status read_connectors(const Source& src, const Field& f, Topology::Connectors* out) {
  MapReader r(src, f);
  r.with("default", [&](const Field& v) {
    return read_parsed(src, v, &parse_instance_connector, &out->default_connector);
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
  r.with("tls", [&](const Field& v) { return read_node_tls(src, v, &out->tls); });
  return r.finish();
}

Status read_timeouts(const Source& src, const Field& f, Topology::Timeouts* out) {
  MapReader r(src, f);
  r.ms("connect_ms", 1, 10 * 60 * 1000, &out->connect);
  r.ms("prefill_ms", 1, kDayMs, &out->prefill);
  r.ms("first_byte_ms", 1, kDayMs, &out->first_byte);
  r.ms("stream_idle_ms", 1, kDayMs, &out->stream_idle);
  r.ms("header_read_ms", 1, kDayMs, &out->header_read);
  r.ms("body_read_ms", 1, kDayMs, &out->body_read);
  r.ms("keep_alive_idle_ms", 1, kDayMs, &out->keep_alive_idle);
  r.ms("drain_ms", 0, kDayMs, &out->drain);
  r.ms("client_write_ms", 1, kDayMs, &out->client_write);
  r.ms("request_ms", 0, kDayMs, &out->request);
  r.ms("orphan_grace_ms", 0, kDayMs, &out->orphan_grace);
  return r.finish();
}

Status read_retries(const Source& src, const Field& f, Topology::Retries* out) {
  MapReader r(src, f);
  r.u32("prefill_attempts", 1, 16, &out->prefill_attempts);
  r.u32("decode_attempts", 1, 16, &out->decode_attempts);
  r.u32("eject_after_connect_failures", 0, 1000, &out->eject_after_connect_failures);
  r.ms("eject_ms", 1, kDayMs, &out->eject);
  return r.finish();
}

Status read_limits(const Source& src, const Field& f, Topology::Limits* out) {
  MapReader r(src, f);
  r.u32("max_body_bytes", 1, 1u << 31, &out->max_body_bytes);
  r.u32("max_header_bytes", 1024, 16u << 20, &out->max_header_bytes);
  r.u32("max_concurrent_requests", 1, 10'000'000, &out->max_concurrent_requests);
  r.u32("max_queued_requests", 0, 1'000'000, &out->max_queued_requests);
  r.u32("max_queued_bytes", 0, 0xFFFFFFFFu, &out->max_queued_bytes);
  r.ms("queue_timeout_ms", 0, kDayMs, &out->queue_timeout);
  r.u32("max_connections", 1, 10'000'000, &out->max_connections);
  r.u32("max_buffered_bytes", 0, 0xFFFFFFFFu, &out->max_buffered_bytes);
  r.u32("max_orphan_legs_per_node", 0, 1'000'000, &out->max_orphan_legs_per_node);
  return r.finish();
}

Status read_kv_events(const Source& src, const Field& f, Topology::KvEvents* out) {
  MapReader r(src, f);
  r.boolean("enabled", &out->enabled);
  r.with("default_port", [&](const Field& v) {
    uint64_t port = 0;
    Status s = read_uint(src, v, 1, 65535, &port, "a port number");
    if (s) out->default_port = static_cast<uint16_t>(port);
    return s;
  });
  r.str("topic", 256, &out->topic);
  r.u32("max_index_entries", 1, 1u << 30, &out->max_index_entries);
  r.u32("max_node_batches_per_sec", 1, 10'000'000, &out->max_node_batches_per_sec);
  r.u32("max_node_bytes_per_sec", 1u << 16, 1u << 30, &out->max_node_bytes_per_sec);
  r.u32("max_ranks_per_node", 1, 1024, &out->max_ranks_per_node);
  r.u32("max_subscriptions", 1, 1'000'000, &out->max_subscriptions);
  return r.finish();
}

Status read_load_signals(const Source& src, const Field& f, Topology::LoadSignals* out) {
  MapReader r(src, f);
  r.boolean("scrape_engine_metrics", &out->scrape_engine_metrics);
  r.ms("interval_ms", 100, 3'600'000, &out->interval);
  r.ms("timeout_ms", 10, 60'000, &out->timeout);
  r.ms("stale_after_ms", 100, kDayMs, &out->stale_after);
  r.u32("max_body_bytes", 1024, 64u << 20, &out->max_body_bytes);
  Status s = r.finish();
  if (s && out->timeout > out->interval) {
    return fail(src, f, StatusCode::kOutOfRange,
                fmt::format("timeout_ms ({}) must be at most interval_ms ({}): one read in flight per node",
                            out->timeout.count(), out->interval.count()));
  }
  if (s && out->stale_after < out->interval) {
    return fail(src, f, StatusCode::kOutOfRange,
                fmt::format("stale_after_ms ({}) must be at least interval_ms ({}), or every figure is stale "
                            "before the next read",
                            out->stale_after.count(), out->interval.count()));
  }
  return s;
}

Status read_conditional_disaggregation(const Source& src, const Field& f, Topology::ConditionalDisaggregation* out) {
  MapReader r(src, f);
  r.boolean("enabled", &out->enabled);
  r.u32("max_prompt_tokens", 0, 1u << 24, &out->max_prompt_tokens);
  r.u32("min_cached_percent", 0, 100, &out->min_cached_percent);
  r.u32("prefill_busy_ms", 0, 3'600'000, &out->prefill_busy_ms);
  return r.finish();
}

Status read_multi_turn(const Source& src, const Field& f, Topology::MultiTurn* out) {
  MapReader r(src, f);
  r.boolean("enabled", &out->enabled);
  r.ms("ttl_ms", 1000, kDayMs, &out->ttl);
  r.u32("max_entries", 1, 1u << 24, &out->max_entries);
  r.u32("max_bytes", 1u << 16, 1u << 31, &out->max_bytes);
  r.with("bind_to", [&](const Field& v) {
    std::string text;
    Status s = read_string(src, v, 256, &text);
    if (!s) return s;
    using BindTo = Topology::MultiTurn::BindTo;
    if (text == "authorization" || text == "none") {
      out->bind_to = text == "none" ? BindTo::kNone : BindTo::kAuthorization;
      out->bind_header.clear();
      return s;
    }
    const std::string_view name = std::string_view(text).substr(std::min<size_t>(text.size(), 7));
    if (!text.starts_with("header:") || name.empty() || !is_http_token(name)) {
      return fail(src, v, StatusCode::kInvalidValue,
                  fmt::format("expected authorization, header:<header name> or none, got {}", quoted_excerpt(text)));
    }
    out->bind_to = BindTo::kHeader;
    out->bind_header.clear();
    for (char c : name) out->bind_header += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    return s;
  });
  r.boolean("allow_anonymous", &out->allow_anonymous);
  read_env_secret(src, r, "binding_secret_env", &out->binding_secret_env, &out->binding_secret);
  if (r.ok() && out->bind_to == Topology::MultiTurn::BindTo::kNone && !out->allow_anonymous) {
    const Field* at = r.take("allow_anonymous");
    r.record(fail(src, at ? *at : f, StatusCode::kInvalidValue,
                  "allow_anonymous: false with bind_to: none leaves no request multi-turn reuse"));
  }
  return r.finish();
}

// A list of at most 8 distinct names, each `valid` (headers are lowered: compared that way).
Status read_name_list(const Source& src, const Field& f, bool header_names, std::vector<std::string>* out) {
  if (!f.value.IsSequence()) {
    return fail(src, f, StatusCode::kWrongType, fmt::format("expected a list of names, got {}", describe(f.value)));
  }
  std::vector<std::string> names;
  size_t i = 0;
  for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
    Field item{YAML::Node(), *it, fmt::format("{}[{}]", f.path, i)};
    if (i >= 8) return fail(src, item, StatusCode::kOutOfRange, "at most 8 names");
    std::string text;
    Status s = read_string(src, item, 128, &text);
    if (!s) return s;
    // A field name is matched against the body's top-level keys as sent, unescaped: printable
    // ASCII without quotes or backslashes.
    const bool valid = !text.empty() && (header_names ? is_http_token(text)
                                                      : std::all_of(text.begin(), text.end(), [](char c) {
                                                          return c > 0x20 && c < 0x7f && c != '"' && c != '\\';
                                                        }));
    if (!valid) {
      return fail(src, item, StatusCode::kInvalidValue,
                  header_names ? "not a valid HTTP header name" : "expected printable ASCII without quotes or backslashes");
    }
    if (header_names) {
      for (char& c : text) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    if (std::find(names.begin(), names.end(), text) != names.end()) {
      return fail(src, item, StatusCode::kInvalidValue, fmt::format("{} is listed twice", quoted_excerpt(text)));
    }
    names.push_back(std::move(text));
  }
  *out = std::move(names);
  return Status::ok();
}

Status read_session_affinity(const Source& src, const Field& f, Topology::SessionAffinity* out) {
  MapReader r(src, f);
  r.boolean("enabled", &out->enabled);
  r.with("headers", [&](const Field& v) { return read_name_list(src, v, true, &out->headers); });
  r.with("fields", [&](const Field& v) { return read_name_list(src, v, false, &out->fields); });
  r.u32("max_sessions", 1, 1u << 24, &out->max_sessions);
  r.ms("idle_ttl_ms", 1000, kDayMs, &out->idle_ttl);
  r.u32("max_id_bytes", 1, 1024, &out->max_id_bytes);
  r.u32("spill_margin_requests", 0, 1u << 20, &out->spill_margin_requests);
  r.ms("spill_margin_queue_ms", 0, 3'600'000, &out->spill_margin_queue);
  if (r.ok() && out->enabled && out->headers.empty() && out->fields.empty()) {
    r.record(fail(src, f, StatusCode::kInvalidValue, "enabled with no headers and no fields: no session id to read"));
  }
  return r.finish();
}

// "/a/b" or "/a/**": printable ASCII without '%', '?', '#' or '*' (but the final "/**"), no empty,
// "." or ".." segment, no trailing '/' (but "/" itself).
bool is_normalised_path_entry(std::string_view text) {
  if (!text.starts_with('/')) return false;
  if (text.ends_with("/**")) text.remove_suffix(3);
  if (text.empty() || text == "/") return true;
  for (const char c : text) {
    if (c <= 0x20 || c >= 0x7f || c == '%' || c == '?' || c == '#' || c == '*') return false;
  }
  size_t at = 1;
  for (;;) {
    const size_t slash = text.find('/', at);
    const std::string_view segment = text.substr(at, slash == std::string_view::npos ? text.npos : slash - at);
    if (segment.empty() || segment == "." || segment == "..") return false;
    if (slash == std::string_view::npos) return true;
    at = slash + 1;
  }
}

// An entry is compared with the decoded, normalised request path (router/proxy/pass_through.h),
// so it must be written in that form: an encoded or dot-segment spelling would never match.
Status read_pass_through_paths(const Source& src, const Field& f, std::vector<std::string>* out) {
  if (!f.value.IsSequence()) {
    return fail(src, f, StatusCode::kWrongType, fmt::format("expected a list of paths, got {}", describe(f.value)));
  }
  std::vector<std::string> paths;
  size_t i = 0;
  for (auto it = f.value.begin(); it != f.value.end(); ++it, ++i) {
    Field item{YAML::Node(), *it, fmt::format("{}[{}]", f.path, i)};
    if (i >= 256) return fail(src, item, StatusCode::kOutOfRange, "at most 256 paths");
    std::string text;
    Status s = read_string(src, item, 256, &text);
    if (!s) return s;
    const bool normal = is_normalised_path_entry(text);
    if (!normal) {
      return fail(src, item, StatusCode::kInvalidValue,
                  "expected a decoded path starting with '/' (no '%', '?', spaces, '//', '.' or '..' segments, "
                  "no trailing '/'; '/**' at the end names a subtree), got " + quoted_excerpt(text));
    }
    paths.push_back(std::move(text));
  }
  *out = std::move(paths);
  return Status::ok();
}

Status read_routing(const Source& src, const Field& f, Topology::Routing* out) {
  MapReader r(src, f);
  r.boolean("pass_through_unknown", &out->pass_through_unknown);
  r.with("pass_through_paths", [&](const Field& v) { return read_pass_through_paths(src, v, &out->pass_through_paths); });
  return r.finish();
}

// A CA bundle or a certificate chain is a few KiB; the cap keeps a wrong path (a log, a disk
// image) from being read whole.
constexpr size_t kMaxEtcdPemBytes = 1 << 20;

Status read_registry(const Source& src, const Field& f, Topology::Registry* out) {
  MapReader r(src, f);
  r.with("backend", [&](const Field& v) {
    Status s = read_string(src, v, 16, &out->backend);
    if (s && out->backend != "memory" && out->backend != "etcd") {
      return fail(src, v, StatusCode::kInvalidValue, "expected memory or etcd");
    }
    return s;
  });
  r.with("etcd_endpoints", [&](const Field& v) {
    if (!v.value.IsSequence()) {
      return fail(src, v, StatusCode::kWrongType, fmt::format("expected a list of host:port, got {}", describe(v.value)));
    }
    size_t i = 0;
    for (auto it = v.value.begin(); it != v.value.end(); ++it, ++i) {
      Field item{YAML::Node(), *it, fmt::format("{}[{}]", v.path, i)};
      std::string text;
      Status s = read_string(src, item, 512, &text);
      if (!s) return s;
      const bool https = text.starts_with("https://");
      if (text.starts_with("http://")) text = text.substr(7);
      if (https) text = text.substr(8);
      if (i > 0 && https != out->etcd_tls) {
        return fail(src, item, StatusCode::kInvalidValue, "mixes https and plain endpoints (all or none use TLS)");
      }
      out->etcd_tls = https;
      proto::HostPort hp;
      s = proto::parse_host_port(text, &hp);
      if (!s) return at_value(src, item, s);
      out->etcd_endpoints.push_back(hp);
    }
    return Status::ok();
  });
  r.with("etcd_prefix", [&](const Field& v) {
    Status s = read_string(src, v, 256, &out->etcd_prefix);
    if (s && out->etcd_prefix.empty()) return fail(src, v, StatusCode::kInvalidValue, "must not be empty");
    return s;
  });
  r.with("replica_id", [&](const Field& v) {
    Status s = read_string(src, v, 128, &out->replica_id);
    if (s && out->replica_id.find('/') != std::string::npos) {
      return fail(src, v, StatusCode::kInvalidValue, "must not contain '/'");
    }
    return s;
  });
  r.with("lease_ttl_s", [&](const Field& v) {
    uint64_t ttl = 0;
    Status s = read_uint(src, v, 2, 3600, &ttl, "seconds");
    if (s) out->lease_ttl = std::chrono::seconds(ttl);
    return s;
  });
  r.str("etcd_user", 256, &out->etcd_user);
  read_env_secret(src, r, "etcd_password_env", &out->etcd_password_env, &out->etcd_password);
  // PEM files for TLS to etcd: untrusted like every file, so capped and checked to hold the
  // right PEM block here; OpenSSL parses them fully when the client starts.
  auto pem = [&](std::string_view key, std::string_view block, std::string* file, std::string* content) {
    read_text_file(src, r, key, kMaxEtcdPemBytes, file, [&, block](const Field& at, std::string_view text) {
      if (text.find(block) == std::string_view::npos) {
        return fail(src, at, StatusCode::kInvalidValue, fmt::format("'{}' holds no PEM {}", *file, block));
      }
      *content = std::string(text);
      return Status::ok();
    });
  };
  pem("etcd_ca_file", "CERTIFICATE-----", &out->etcd_ca_file, &out->etcd_ca_pem);
  pem("etcd_cert_file", "CERTIFICATE-----", &out->etcd_cert_file, &out->etcd_cert_pem);
  pem("etcd_key_file", "PRIVATE KEY-----", &out->etcd_key_file, &out->etcd_key_pem);
  Status s = r.finish();
  if (s && out->backend == "etcd" && out->etcd_endpoints.empty()) {
    return fail(src, f, StatusCode::kMissingKey, "backend etcd needs etcd_endpoints");
  }
  if (s && out->etcd_cert_file.empty() != out->etcd_key_file.empty()) {
    return fail(src, f, StatusCode::kInvalidValue, "etcd_cert_file and etcd_key_file go together (mutual TLS)");
  }
  const bool tls_files = !out->etcd_ca_file.empty() || !out->etcd_cert_file.empty();
  if (s && tls_files && !out->etcd_tls) {
    return fail(src, f, StatusCode::kInvalidValue,
                "etcd_ca_file / etcd_cert_file / etcd_key_file need https:// etcd_endpoints");
  }
  return s;
}

Status read_kubernetes(const Source& src, const Field& f, Topology::Kubernetes* out) {
  MapReader r(src, f);
  r.boolean("enabled", &out->enabled);
  r.with("api_server", [&](const Field& v) {
    Status s = read_string(src, v, 512, &out->api_server_url);
    if (!s) return s;
    std::string text = out->api_server_url;
    out->api_server_tls = text.starts_with("https://");
    if (!out->api_server_tls && !text.starts_with("http://")) {
      return fail(src, v, StatusCode::kInvalidValue, "expected http://host:port or https://host:port");
    }
    text = text.substr(out->api_server_tls ? 8 : 7);
    if (!text.empty() && text.back() == '/') text.pop_back();
    s = proto::parse_host_port(text, &out->api_server);
    return s ? s : at_value(src, v, s);
  });
  r.with("namespace", [&](const Field& v) {
    Status s = read_string(src, v, 63, &out->namespace_name);
    if (s && out->namespace_name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") != std::string::npos) {
      return fail(src, v, StatusCode::kInvalidValue, "expected a namespace name (a-z, 0-9, '-')");
    }
    return s;
  });
  r.str("label_selector", 1024, &out->label_selector);
  r.str("token_file", 1024, &out->token_file);
  r.ms("token_refresh_ms", 1000, kDayMs, &out->token_refresh);
  r.with("role_label", [&](const Field& v) {
    Status s = read_string(src, v, 317, &out->role_label);
    if (s && out->role_label.empty()) return fail(src, v, StatusCode::kInvalidValue, "must not be empty");
    out->role_label_set = true;
    return s;
  });
  auto selector = [&](const char* key, proto::LabelSelector* sel) {
    r.with(key, [&src, sel](const Field& v) {
      std::string text;
      Status s = read_string(src, v, proto::kMaxLabelSelectorBytes, &text);
      if (!s) return s;
      if (text.find_first_not_of(" \t") == std::string::npos) {
        return fail(src, v, StatusCode::kInvalidValue, "must not be empty (an empty selector matches every pod)");
      }
      s = proto::parse_label_selector(text, sel);
      return s ? s : at_value(src, v, s);
    });
  };
  selector("prefill_selector", &out->prefill_selector);
  selector("decode_selector", &out->decode_selector);
  r.port("port", &out->port);
  r.with("watch_timeout_s", [&](const Field& v) {
    uint64_t seconds = 0;
    Status s = read_uint(src, v, 1, 3600, &seconds, "seconds");
    if (s) out->watch_timeout = std::chrono::seconds(seconds);
    return s;
  });
  r.ms("retry_ms", 10, 10 * 60 * 1000, &out->retry);
  read_text_file(src, r, "ca_file", kMaxEtcdPemBytes, &out->ca_file, [&](const Field& at, std::string_view text) {
    if (text.find("CERTIFICATE-----") == std::string_view::npos) {
      return fail(src, at, StatusCode::kInvalidValue, fmt::format("'{}' holds no PEM CERTIFICATE", out->ca_file));
    }
    out->ca_pem = std::string(text);
    return Status::ok();
  });
  Status s = r.finish();
  if (s && !out->ca_file.empty() && !out->api_server_tls) {
    return fail(src, f, StatusCode::kInvalidValue, "ca_file needs an https:// api_server");
  }
  if (s && out->prefill_selector.text.empty() != out->decode_selector.text.empty()) {
    return fail(src, f, StatusCode::kMissingKey, "prefill_selector and decode_selector go together");
  }
  if (s && out->uses_selectors() && out->role_label_set) {
    return fail(src, f, StatusCode::kInvalidValue,
                "set role_label or prefill_selector/decode_selector, not both (two ways to give a pod its role)");
  }
  if (s && out->enabled && (out->api_server_url.empty() || out->namespace_name.empty())) {
    return fail(src, f, StatusCode::kMissingKey, "kubernetes.enabled needs api_server and namespace");
  }
  return s;
}

Status read_admin(const Source& src, const Field& f, Topology::Admin* out) {
  MapReader r(src, f);
  read_env_secret(src, r, "api_key_env", &out->api_key_env, &out->api_key);
  read_file_secret(src, r, "api_key_file", &out->api_key_file, &out->api_key);
  r.boolean("protect_status", &out->protect_status);
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

// The connector rules live in instance_spec.h (shared with the admin API); this points their
// errors at the YAML key to blame.
Status check_connector_fields(const Source& src, MapReader& r, const Topology::Connectors& defaults,
                              StaticInstance* inst) {
  const Field* zmq = r.take("zmq_address");
  const Field* mode = r.take("transfer_mode");
  std::string_view field;
  Status s = check_instance_connector_fields(defaults, {zmq != nullptr, mode != nullptr}, inst, &field);
  if (s) return s;
  const Field* at = field == "zmq_address" ? zmq : field == "transfer_mode" ? mode : nullptr;
  return fail(src, at != nullptr ? *at : r.self(), s.code(), s.message());
}

Status read_instance(const Source& src, const Field& f, const Topology::Connectors& defaults,
                     StaticInstance* out, std::optional<NodeTls>* tls) {
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
    return read_parsed(src, v, &parse_instance_role, &inst.role);
  });
  r.with("http_address", [&](const Field& v) {
    has_http = true;
    return read_parsed(src, v, &proto::parse_host_port, &inst.http_address);
  });
  r.with("connector", [&](const Field& v) {
    return read_parsed(src, v, &parse_node_connector, &inst.connector);
  });
  r.with("transfer_mode", [&](const Field& v) {
    return read_parsed(src, v, &parse_instance_transfer_mode, &inst.transfer_mode);
  });
  r.str("zmq_address", kMaxStringBytes, &inst.zmq_address);
  r.u32("dp_size", 1, kMaxParallelSize, &inst.dp_size);
  r.u32("tp_size", 1, kMaxParallelSize, &inst.tp_size);
  r.u32("pp_size", 1, kMaxParallelSize, &inst.pp_size);
  r.str("engine_id", kMaxEngineIdBytes, &inst.engine_id);
  r.with("bootstrap_port", [&](const Field& v) {
    uint64_t port = 0;
    Status s = read_uint(src, v, 1, 65535, &port, "a port number");
    if (s) inst.bootstrap_port = static_cast<uint16_t>(port);
    return s;
  });
  r.with("kv_events_endpoint", [&](const Field& v) {
    proto::HostPort hp;
    Status s = read_parsed(src, v, &proto::parse_zmq_tcp_endpoint, &hp);
    if (s) inst.kv_events_endpoint = hp;
    return s;
  });
  r.with("kv_events_replay_endpoint", [&](const Field& v) {
    proto::HostPort hp;
    Status s = read_parsed(src, v, &proto::parse_zmq_tcp_endpoint, &hp);
    if (s) inst.kv_events_replay_endpoint = hp;
    return s;
  });
  r.str("model", kMaxStringBytes, &inst.model);
  r.with("labels", [&](const Field& v) { return read_labels(src, v, &inst.labels); });
  r.with("tls", [&](const Field& v) {
    NodeTls own = defaults.tls;  // the section's settings, replaced where the instance says
    Status s = read_node_tls(src, v, &own);
    if (s) *tls = std::move(own);
    return s;
  });
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
                      std::vector<StaticInstance>* out, std::vector<NodeTlsOverride>* tls_by_node) {
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
    std::optional<NodeTls> tls;
    Status s = read_instance(src, item, defaults, &inst, &tls);
    if (!s) return s;
    if (tls) tls_by_node->push_back(NodeTlsOverride{inst.http_address, std::move(*tls)});
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

// Cross-section rules of discovery admission (listeners + discovery).
Status check_discovery_admission(const Source& src, const YAML::Node& root, const Topology& t) {
  const YAML::Node discovery = root.IsMap() ? root["discovery"] : YAML::Node();
  const YAML::Mark mark = discovery.IsDefined() ? discovery.Mark() : root.Mark();
  const bool has_curve_key = !t.discovery.curve.server_keys.secret_z85.empty();
  if (!t.listeners.discovery_curve.empty() && !has_curve_key) {
    return fail_at(src, mark, "listeners.discovery_curve", StatusCode::kMissingKey,
                   "a CURVE endpoint needs discovery.curve.secret_key_file (make one with `pdnode keygen`)");
  }
  if (t.listeners.discovery_curve == t.listeners.discovery) {
    return fail_at(src, mark, "listeners.discovery_curve", StatusCode::kInvalidValue,
                   "must differ from listeners.discovery");
  }
  if (t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve) && !t.discovery.allow_open) {
    return fail_at(src, mark, "discovery.allowed_peers", StatusCode::kInvalidValue,
                   fmt::format("admits every address on {}, which the network can reach: anyone could "
                               "register nodes that receive client prompts. List your node networks "
                               "instead, or set discovery.allow_open: true to run it open",
                               t.listeners.discovery));
  }
  return Status::ok();
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
  r.with("kv_events", [&](const Field& f) { return read_kv_events(src, f, &t.kv_events); });
  r.with("load_signals", [&](const Field& f) { return read_load_signals(src, f, &t.load_signals); });
  r.with("multi_turn", [&](const Field& f) { return read_multi_turn(src, f, &t.multi_turn); });
  r.with("session_affinity", [&](const Field& f) { return read_session_affinity(src, f, &t.session_affinity); });
  r.with("conditional_disaggregation", [&](const Field& f) {
    return read_conditional_disaggregation(src, f, &t.conditional_disaggregation);
  });
  r.with("routing", [&](const Field& f) { return read_routing(src, f, &t.routing); });
  r.with("registry", [&](const Field& f) { return read_registry(src, f, &t.registry); });
  r.with("kubernetes", [&](const Field& f) { return read_kubernetes(src, f, &t.kubernetes); });
  r.with("client_auth", [&](const Field& f) { return read_client_auth(src, f, &t.client_auth); });
  r.with("tenants", [&](const Field& f) { return read_tenants(src, f, &t.tenants); });
  r.with("access_log", [&](const Field& f) { return read_access_log(src, f, &t.access_log); });
  // After connectors: instance defaults come from there.
  r.with("instances", [&](const Field& f) {
    return read_instances(src, f, t.connectors, &t.static_instances, &t.connectors.tls_by_node);
  });
  r.with("tracing", [&](const Field& f) { return read_tracing(src, f, &t.tracing); });
  Status s = r.finish();
  if (s) s = check_discovery_admission(src, root, t);
  if (s) *out = std::move(t);
  return s;
}

Status parse_text(const Source& src, std::string_view yaml_text, Topology* out) {
  const std::string text(yaml_text);
  Status s = yaml::check_event_budget(src, text);
  if (!s) return s;
  std::vector<YAML::Node> docs = YAML::LoadAll(text);
  if (docs.empty()) {
    // A named default, not `*out = Topology{}`: GCC 12 at -O3 (the quick start's Release build)
    // reports the temporary's strings as maybe-uninitialized (a false positive).
    Topology defaults;
    std::swap(*out, defaults);
    return Status::ok();
  }
  if (docs.size() > 1) {
    return fail_at(src, docs[1].Mark(), "", StatusCode::kInvalidValue,
                   "more than one YAML document (only one topology per file)");
  }
  size_t nodes = 0;
  s = yaml::check_tree_size(src, docs[0], 1, &nodes);
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
  for (const std::string& warning : topology_warnings(t)) pdr::log::warn("topology {}: {}", path, warning);
  *out = std::move(t);
  return Status::ok();
}

}  // namespace pdr::config
