// Admin request validation; contracts in admin_request.h.
#include "router/admin_request.h"

#include <fmt/format.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "discovery/config/instance_spec.h"
#include "discovery/config/key_hint.h"
#include "proto/address.h"
#include "proto/base/ascii.h"
#include "proto/quoted_text.h"

namespace pdr::router {
namespace {

using nlohmann::json;

constexpr size_t kMaxStringBytes = 1024;  // as the topology file's strings
constexpr size_t kMaxPathAddressBytes = 300;
// The body object and one map inside it (labels); anything deeper is no field of ours, and the
// bound keeps a hostile body from building a deep tree.
constexpr int kMaxNesting = 2;

Status field_error(std::string_view key, const Status& s) {
  return Status(s.code(), fmt::format("{}: {}", key, s.message()));
}

std::string describe(const json& j) {
  if (j.is_string()) return "the string " + proto::quote_untrusted(j.get_ref<const std::string&>(), 40);
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  return j.dump();  // number, true/false, null
}

// One JSON object, with duplicate keys refused (nlohmann would keep the last one silently).
Status parse_object(std::string_view body, json* out) {
  if (body.size() > kMaxAdminBodyBytes) {
    return Status(StatusCode::kTooLarge,
                  fmt::format("body is {} bytes (limit {})", body.size(), kMaxAdminBodyBytes));
  }
  std::vector<std::set<std::string>> open_objects;  // keys seen, per object being parsed
  Status problem;
  auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (!problem) return false;  // first problem wins; the rest is discarded unread
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxNesting) {
          problem = Status(StatusCode::kTooDeep,
                           fmt::format("body nests deeper than {} levels", kMaxNesting));
          return false;
        }
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        return true;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        return true;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          problem = Status(StatusCode::kInvalidValue,
                           fmt::format("duplicate key {}", proto::quote_untrusted(key, 40)));
          return false;
        }
        return true;
      }
      default:
        return true;
    }
  };
  json doc;
  try {
    doc = json::parse(body.begin(), body.end(), check, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    if (!problem) return problem;
    // "[json.exception.parse_error.101] parse error at line 1, column 3: ..." -> from "parse error".
    std::string_view what = e.what();
    if (size_t bracket = what.find("] "); bracket != std::string_view::npos) what.remove_prefix(bracket + 2);
    return Status(StatusCode::kMalformed, fmt::format("body is not valid JSON: {}", what));
  }
  if (!problem) return problem;
  if (!doc.is_object()) {
    return Status(StatusCode::kWrongType, fmt::format("body must be a JSON object, got {}", describe(doc)));
  }
  *out = std::move(doc);
  return Status::ok();
}

Status check_known_keys(const json& obj, const std::vector<std::string_view>& known) {
  for (const auto& [key, value] : obj.items()) {
    bool found = false;
    for (std::string_view k : known) found = found || k == key;
    if (!found) {
      return Status(StatusCode::kInvalidValue,
                    fmt::format("unknown key {} ({})", proto::quote_untrusted(key, 40),
                                config::unknown_key_hint(key, known)));
    }
  }
  return Status::ok();
}

// A string of at most `max_bytes` without control characters. Absent: OK with *given false.
Status read_string(const json& obj, std::string_view key, size_t max_bytes, std::string* out,
                   bool* given = nullptr) {
  auto it = obj.find(key);
  if (given != nullptr) *given = it != obj.end();
  if (it == obj.end()) return Status::ok();
  if (!it->is_string()) {
    return Status(StatusCode::kWrongType,
                  fmt::format("{}: expected a string, got {}", key, describe(*it)));
  }
  const auto& text = it->get_ref<const std::string&>();
  if (text.size() > max_bytes) {
    return Status(StatusCode::kTooLarge,
                  fmt::format("{}: {} bytes (limit {})", key, text.size(), max_bytes));
  }
  if (has_control_chars(text)) {
    return Status(StatusCode::kInvalidValue, fmt::format("{}: contains control characters", key));
  }
  *out = text;
  return Status::ok();
}

// A JSON integer in [min, max]. Absent: OK, *out untouched.
Status read_uint(const json& obj, std::string_view key, uint64_t min, uint64_t max, uint64_t* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::ok();
  if (!it->is_number_integer()) {
    return Status(StatusCode::kWrongType,
                  fmt::format("{}: expected an integer, got {}", key, describe(*it)));
  }
  if (!it->is_number_unsigned() || it->get<uint64_t>() < min || it->get<uint64_t>() > max) {
    return Status(StatusCode::kOutOfRange,
                  fmt::format("{}: {} is out of range ({}..{})", key, it->dump(), min, max));
  }
  *out = it->get<uint64_t>();
  return Status::ok();
}

// A string naming a value, parsed by one of instance_spec.h's parsers.
template <typename T>
Status read_named(const json& obj, std::string_view key, Status (*parse)(std::string_view, T*), T* out,
                  bool* given = nullptr) {
  std::string text;
  bool present = false;
  Status s = read_string(obj, key, kMaxStringBytes, &text, &present);
  if (given != nullptr) *given = present;
  if (!s || !present) return s;
  s = parse(text, out);
  return s ? s : field_error(key, s);
}

Status parse_address(std::string_view text, proto::HostPort* out) { return proto::parse_host_port(text, out); }

// An optional tcp://host:port key (proto::parse_zmq_tcp_endpoint).
Status read_zmq_endpoint(const json& obj, std::string_view key, std::optional<proto::HostPort>* out) {
  proto::HostPort endpoint;
  bool given = false;
  Status s = read_named(obj, key, &proto::parse_zmq_tcp_endpoint, &endpoint, &given);
  if (s && given) *out = std::move(endpoint);
  return s;
}

Status read_labels(const json& obj, proto::Labels* out) {
  auto it = obj.find("labels");
  if (it == obj.end()) return Status::ok();
  if (!it->is_object()) {
    return Status(StatusCode::kWrongType,
                  fmt::format("labels: expected an object of strings, got {}", describe(*it)));
  }
  if (it->size() > config::kMaxLabels) {
    return Status(StatusCode::kTooLarge,
                  fmt::format("labels: {} labels (limit {})", it->size(), config::kMaxLabels));
  }
  proto::Labels labels;
  for (const auto& [key, value] : it->items()) {  // an object iterates in key order: sorted
    if (key.empty() || key.size() > config::kMaxLabelKeyBytes || has_control_chars(key)) {
      return Status(StatusCode::kInvalidValue,
                    fmt::format("labels: label key must be 1..{} printable bytes",
                                config::kMaxLabelKeyBytes));
    }
    std::string text;
    Status s = read_string(*it, key, config::kMaxLabelValueBytes, &text);
    if (!s) return field_error("labels", s);
    labels.emplace_back(key, std::move(text));
  }
  *out = std::move(labels);
  return Status::ok();
}

Status read_u32(const json& obj, std::string_view key, uint64_t min, uint64_t max, uint32_t* out) {
  uint64_t v = *out;
  Status s = read_uint(obj, key, min, max, &v);
  if (s) *out = static_cast<uint32_t>(v);
  return s;
}

}  // namespace

Status parse_admin_instance(std::string_view body, const config::Topology::Connectors& defaults,
                            config::StaticInstance* out) {
  static const std::vector<std::string_view> kKeys = {
      "role", "http_address", "connector", "transfer_mode", "zmq_address",
      "dp_size", "tp_size", "bootstrap_port", "kv_events_endpoint", "kv_events_replay_endpoint",
      "model", "labels", "engine_id", "pp_size"};
  json doc;
  Status s = parse_object(body, &doc);
  if (s) s = check_known_keys(doc, kKeys);
  if (!s) return s;

  config::StaticInstance inst;
  inst.connector = defaults.default_connector;
  bool has_role = false, has_http = false;
  config::InstanceKeysGiven given;
  uint64_t bootstrap_port = 0;
  // Each read runs only while everything before it succeeded: the first error is the answer.
  for (auto read : std::initializer_list<std::function<Status()>>{
           [&] { return read_named(doc, "role", &config::parse_instance_role, &inst.role, &has_role); },
           [&] { return read_named(doc, "http_address", &parse_address, &inst.http_address, &has_http); },
           [&] { return read_named(doc, "connector", &config::parse_node_connector, &inst.connector); },
           [&] {
             return read_named(doc, "transfer_mode", &config::parse_instance_transfer_mode,
                               &inst.transfer_mode, &given.transfer_mode);
           },
           [&] { return read_string(doc, "zmq_address", kMaxStringBytes, &inst.zmq_address, &given.zmq_address); },
           [&] { return read_u32(doc, "dp_size", 1, config::kMaxParallelSize, &inst.dp_size); },
           [&] { return read_u32(doc, "tp_size", 1, config::kMaxParallelSize, &inst.tp_size); },
           [&] { return read_uint(doc, "bootstrap_port", 1, 65535, &bootstrap_port); },
           [&] { return read_zmq_endpoint(doc, "kv_events_endpoint", &inst.kv_events_endpoint); },
           [&] {
             return read_zmq_endpoint(doc, "kv_events_replay_endpoint", &inst.kv_events_replay_endpoint);
           },
           [&] { return read_string(doc, "model", kMaxStringBytes, &inst.model); },
           [&] { return read_labels(doc, &inst.labels); },
           [&] { return read_string(doc, "engine_id", config::kMaxEngineIdBytes, &inst.engine_id); },
           [&] { return read_u32(doc, "pp_size", 1, config::kMaxParallelSize, &inst.pp_size); },
       }) {
    if (s = read(); !s) return s;
  }
  if (!has_role) return Status(StatusCode::kMissingKey, "missing key 'role' (prefill or decode)");
  if (!has_http) return Status(StatusCode::kMissingKey, "missing key 'http_address' (host:port)");
  if (bootstrap_port != 0) inst.bootstrap_port = static_cast<uint16_t>(bootstrap_port);
  std::string_view field;
  s = config::check_instance_connector_fields(defaults, given, &inst, &field);
  if (!s) return field.empty() ? s : field_error(field, s);
  *out = std::move(inst);
  return Status::ok();
}

Status parse_seed_add_instance(std::string_view body, const config::Topology::Connectors& defaults,
                               config::StaticInstance* out) {
  json doc;
  Status s = parse_object(body, &doc);
  if (s) s = check_known_keys(doc, {"type", "instance"});
  if (!s) return s;
  config::StaticInstance inst;
  // The demo proxy accepts exactly these two spellings.
  std::string type;
  s = read_string(doc, "type", kMaxStringBytes, &type);
  if (!s || (type != "prefill" && type != "decode")) {
    return Status(StatusCode::kInvalidValue, "Invalid instance type. type must be \"prefill\" or \"decode\"");
  }
  inst.role = type == "prefill" ? proto::Role::kPrefill : proto::Role::kDecode;
  std::string address;
  s = read_string(doc, "instance", kMaxStringBytes, &address);
  if (!s || address.find(':') == std::string::npos) {
    return Status(StatusCode::kInvalidValue, "Invalid instance format. instance must be \"host:port\"");
  }
  if (s = proto::parse_host_port(address, &inst.http_address); !s) {
    return Status(StatusCode::kBadAddress, "Invalid instance address. " + s.message());
  }
  inst.connector = defaults.default_connector;
  std::string_view field;
  s = config::check_instance_connector_fields(defaults, {}, &inst, &field);
  if (!s) {
    return Status(s.code(),
                  fmt::format("the default connector (connectors.default: {}) needs more than an "
                              "address ({}); add this instance with POST /admin/instances instead",
                              proto::to_string(inst.connector), s.message()));
  }
  *out = std::move(inst);
  return Status::ok();
}

Status parse_instance_key(std::string_view segment, std::string* key) {
  if (segment.size() > kMaxPathAddressBytes) {
    return Status(StatusCode::kBadAddress,
                  fmt::format("instance address is {} bytes (limit {})", segment.size(), kMaxPathAddressBytes));
  }
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = ascii_lower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  std::string decoded;
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      decoded += segment[i];
      continue;
    }
    const int hi = i + 2 < segment.size() ? hex(segment[i + 1]) : -1;
    const int lo = hi >= 0 ? hex(segment[i + 2]) : -1;
    if (lo < 0) return Status(StatusCode::kBadAddress, "bad percent-encoding in the instance address");
    decoded += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  proto::HostPort hp;
  Status s = proto::parse_host_port(decoded, &hp);
  if (!s) return s;
  *key = hp.to_string();
  return Status::ok();
}

}  // namespace pdr::router
