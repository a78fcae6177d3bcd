// Decoding of discovery messages and acks from untrusted bytes (contract: discovery_message.h).
// Each dialect has its own decoder; decode_by_type() picks one from `type` and the presence of
// `pdr_v`. Field access goes through FieldReader (msgpack_fields.h), so every error names its key.
#include <algorithm>
#include <limits>

#include "proto/connectors.h"
#include "proto/dialects/dialect.h"
#include "proto/discovery_message.h"
#include "proto/msgpack_fields.h"
#include "proto/msgpack_limits.h"
#include "proto/quoted_text.h"

namespace pdr::proto {

namespace {

using msgpack::type::object_type;

constexpr uint64_t kMaxParallelSize = 1024;
constexpr uint64_t kMaxPort = 65535;
constexpr uint64_t kMaxUint32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxUint64 = std::numeric_limits<uint64_t>::max();
constexpr size_t kMaxInstanceIdBytes = 128;
constexpr size_t kMaxModelBytes = 256;
constexpr size_t kMaxAuthBytes = 256;
constexpr size_t kMaxLabels = 32;
constexpr size_t kMaxLabelKeyBytes = 64;
constexpr size_t kMaxLabelValueBytes = 256;
constexpr size_t kMaxEngineIdBytes = 256;
constexpr size_t kMaxZmqEndpointBytes = 300;  // "tcp://" + a 253-char DNS name + ":65535"
constexpr size_t kNoExtraStringLimit = std::numeric_limits<size_t>::max();

// Missing-key messages name the dialect being decoded ("dp_size is required for a MoRIIO
// registration"), so an operator can tell which shape the router thought it was reading.
constexpr std::string_view kMoriioContext = "a MoRIIO registration";
constexpr std::string_view kMoriioLegacyContext = "a MoRIIO legacy registration";
constexpr std::string_view kP2pNcclContext = "a P2P-NCCL registration";
constexpr std::string_view kPdContext = "a P/D registration";
constexpr std::string_view kPdrouterContext = "a pdrouter registration";
constexpr std::string_view kGoodbyeContext = "a goodbye";
constexpr std::string_view kAckContext = "an ack";

Status address_error(std::string_view key, std::string_view text, const Status& reason) {
  return Status(reason.code(),
                std::string(key) + " " + quote_untrusted(text) + ": " + reason.message());
}

Status read_host_port(const FieldReader& reader, std::string_view key, Need need, HostPort* out,
                      bool* present = nullptr) {
  std::string text;
  bool has = false;
  if (Status s = reader.string(key, need, kNoExtraStringLimit, &text, &has); !s) return s;
  if (present != nullptr) *present = has;
  if (!has) return Status::ok();
  if (Status s = parse_host_port(text, out); !s) return address_error(key, text, s);
  return Status::ok();
}

Status parse_moriio_zmq_field(const std::string& text, Registration* reg) {
  MoriioZmqAddress parsed;
  if (Status s = parse_moriio_zmq_address(text, &parsed); !s) {
    return address_error("zmq_address", text, s);
  }
  reg->moriio_zmq = std::move(parsed);
  return Status::ok();
}

Status parse_kv_address_field(const std::string& text, Registration* reg) {
  HostPort parsed;
  if (Status s = parse_host_port(text, &parsed); !s) return address_error("zmq_address", text, s);
  reg->kv_address = std::move(parsed);
  return Status::ok();
}

Status read_parallel_size(const FieldReader& reader, std::string_view key, Need need,
                          uint32_t* out) {
  return reader.integer(key, need, 1, kMaxParallelSize, out);
}

// Only READ and WRITE (any case) are valid on the wire; kNone is expressed by leaving the key out.
Status read_transfer_mode(const FieldReader& reader, Need need, TransferMode* out) {
  std::string text;
  bool present = false;
  if (Status s = reader.string("transfer_mode", need, kNoExtraStringLimit, &text, &present); !s) {
    return s;
  }
  if (!present) return Status::ok();
  TransferMode mode = TransferMode::kNone;
  if (!parse_transfer_mode(text, &mode) || mode == TransferMode::kNone) {
    return Status(StatusCode::kInvalidValue,
                  "transfer_mode " + quote_untrusted(text) + " is not READ or WRITE");
  }
  *out = mode;
  return Status::ok();
}

Status parse_role_field(std::string_view text, Role* out) {
  if (!parse_role(text, out)) {
    return Status(StatusCode::kInvalidValue,
                  "role " + quote_untrusted(text) + " is not P, D, prefill or decode");
  }
  return Status::ok();
}

Status read_role(const FieldReader& reader, Need need, Role* out, bool* present) {
  std::string text;
  if (Status s = reader.string("role", need, kNoExtraStringLimit, &text, present); !s) return s;
  if (!*present) return Status::ok();
  return parse_role_field(text, out);
}

Status read_schema_version(const FieldReader& reader, uint32_t* out) {
  return reader.integer("pdr_v", Need::kRequired, 1, kMaxUint32, out);
}

// MoRIIO current: exactly the keys the reference toy proxy requires.
Status decode_moriio_current(const FieldMap& fields, Role role, std::string zmq_text,
                             Registration* reg) {
  const FieldReader reader(fields, kMoriioContext);
  reg->format = RegistrationFormat::kMoriio;
  reg->connector = Connector::kMoriio;
  reg->role = role;
  if (Status s = read_host_port(reader, "http_address", Need::kRequired, &reg->http_address); !s) {
    return s;
  }
  if (Status s = parse_moriio_zmq_field(zmq_text, reg); !s) return s;
  reg->zmq_address = std::move(zmq_text);
  if (Status s = read_parallel_size(reader, "dp_size", Need::kRequired, &reg->dp_size); !s)
    return s;
  if (Status s = read_parallel_size(reader, "tp_size", Need::kRequired, &reg->tp_size); !s)
    return s;
  return read_transfer_mode(reader, Need::kRequired, &reg->transfer_mode);
}

// P2P-NCCL: {type, http_address, zmq_address}; anything else the node adds is ignored.
Status decode_p2p_nccl(const FieldMap& fields, Role role, std::string zmq_text, Registration* reg) {
  const FieldReader reader(fields, kP2pNcclContext);
  reg->format = RegistrationFormat::kP2pNccl;
  reg->connector = Connector::kP2pNccl;
  reg->role = role;
  if (Status s = read_host_port(reader, "http_address", Need::kRequired, &reg->http_address); !s) {
    return s;
  }
  if (Status s = parse_kv_address_field(zmq_text, reg); !s) return s;
  reg->zmq_address = std::move(zmq_text);
  return Status::ok();
}

Status read_legacy_index(const FieldReader& reader, std::string* out) {
  const msgpack::object* value = reader.find("index", Need::kOptional);
  if (value == nullptr) return Status::ok();
  switch (value->type) {
    case object_type::STR: return as_string(*value, "index", kNoExtraStringLimit, out);
    case object_type::POSITIVE_INTEGER: *out = std::to_string(value->via.u64); return Status::ok();
    case object_type::NEGATIVE_INTEGER: *out = std::to_string(value->via.i64); return Status::ok();
    default: return wrong_type("index", "a string or an integer", *value);
  }
}

// MoRIIO legacy (`type: register`), as vllm-project/router's moriio_service_discovery.rs parses
// it. `pdr_v` is ignored here: the legacy shape carries no pdrouter extension.
Status decode_moriio_legacy(const FieldMap& fields, Registration* reg) {
  const FieldReader reader(fields, kMoriioLegacyContext);
  reg->format = RegistrationFormat::kMoriioLegacy;
  reg->connector = Connector::kMoriio;
  bool has_role = false;
  if (Status s = read_role(reader, Need::kRequired, &reg->role, &has_role); !s) return s;
  std::string url_text;
  if (Status s = reader.string("request_address", Need::kRequired, kNoExtraStringLimit, &url_text);
      !s) {
    return s;
  }
  HttpUrl url;
  if (Status s = parse_http_url(url_text, &url); !s) {
    return address_error("request_address", url_text, s);
  }
  MoriioZmqAddress zmq;
  zmq.host = url.address.host;
  if (Status s =
          reader.integer("handshake_port", Need::kRequired, 1, kMaxPort, &zmq.handshake_port);
      !s) {
    return s;
  }
  if (Status s = reader.integer("notify_port", Need::kRequired, 1, kMaxPort, &zmq.notify_port);
      !s) {
    return s;
  }
  if (Status s = read_parallel_size(reader, "dp_size", Need::kRequired, &reg->dp_size); !s)
    return s;
  if (Status s = read_parallel_size(reader, "tp_size", Need::kRequired, &reg->tp_size); !s)
    return s;
  if (Status s = read_transfer_mode(reader, Need::kRequired, &reg->transfer_mode); !s) return s;
  if (Status s = read_legacy_index(reader, &reg->legacy_index); !s) return s;
  reg->http_address = std::move(url.address);
  reg->zmq_address = zmq.to_string();
  reg->moriio_zmq = std::move(zmq);
  return Status::ok();
}

// "none" (exactly, as the encoder writes it) sets *none: the node has no KV connector.
Status read_connector(const FieldReader& reader, Connector* out, bool* present, bool* none) {
  std::string text;
  if (Status s = reader.string("connector", Need::kOptional, kNoExtraStringLimit, &text, present);
      !s) {
    return s;
  }
  *none = *present && text == kNoConnectorName;
  if (*none) {
    *out = Connector::kUnknown;
    return Status::ok();
  }
  if (*present && !parse_connector(text, out)) {
    return Status(StatusCode::kInvalidValue, "connector " + quote_untrusted(text) + " is not one of " +
                                                 kv_connector_names() + ", " +
                                                 std::string(to_string(Connector::kUnknown)) + ", " +
                                                 std::string(kNoConnectorName));
  }
  return Status::ok();
}

Connector infer_connector(bool has_zmq, std::string_view zmq_text) {
  if (!has_zmq) return Connector::kUnknown;
  return looks_like_moriio_zmq_address(zmq_text) ? Connector::kMoriio : Connector::kP2pNccl;
}

// The base keys of a pdrouter registration, validated against its (given or inferred) connector.
Status decode_pdrouter_base(const FieldReader& reader, Registration* reg) {
  if (Status s = read_host_port(reader, "http_address", Need::kRequired, &reg->http_address); !s) {
    return s;
  }
  std::string zmq_text;
  bool has_zmq = false;
  if (Status s =
          reader.string("zmq_address", Need::kOptional, kNoExtraStringLimit, &zmq_text, &has_zmq);
      !s) {
    return s;
  }
  bool has_connector = false;
  if (Status s = read_connector(reader, &reg->connector, &has_connector, &reg->no_connector); !s) return s;
  // "unknown" means "not stated": infer, exactly as when the key is absent ("none" is stated).
  if (!reg->no_connector && (!has_connector || reg->connector == Connector::kUnknown)) {
    reg->connector = infer_connector(has_zmq, zmq_text);
  }

  // The zmq_address form and the transfer modes are the connector's dialect facts
  // (proto/dialects/dialect.h), as for an operator-described instance (discovery/config/instance_spec.cc).
  const Dialect* dialect = any_dialect_of(reg->connector);
  const ZmqAddressForm form = dialect != nullptr ? dialect->zmq_address : ZmqAddressForm::kNone;
  const bool is_moriio = form == ZmqAddressForm::kMoriio;
  const bool needs_host_port = form == ZmqAddressForm::kHostPort;
  if ((is_moriio || needs_host_port) && !has_zmq) {
    return Status(
        StatusCode::kMissingKey,
        std::string("zmq_address is required for a pdrouter registration with connector ") +
            std::string(to_string(reg->connector)));
  }
  if (is_moriio) {
    if (Status s = parse_moriio_zmq_field(zmq_text, reg); !s) return s;
  } else if (needs_host_port || (form == ZmqAddressForm::kPrefillHostPort && has_zmq)) {
    // P2P-NCCL's host:port, NIXL push's KV side channel (VLLM_NIXL_SIDE_CHANNEL_HOST:PORT).
    if (Status s = parse_kv_address_field(zmq_text, reg); !s) return s;
  } else if (zmq_text.find('\0') != std::string::npos) {
    return Status(StatusCode::kBadAddress,
                  "zmq_address " + quote_untrusted(zmq_text) + ": contains a NUL byte");
  }
  reg->zmq_address = std::move(zmq_text);
  if (Status s = read_parallel_size(reader, "dp_size", Need::kOptional, &reg->dp_size); !s)
    return s;
  if (Status s = read_parallel_size(reader, "tp_size", Need::kOptional, &reg->tp_size); !s)
    return s;
  const bool has_modes = pairing_mode(reg->connector, TransferMode::kRead) != TransferMode::kNone;
  if (has_modes && !reader.find("transfer_mode", Need::kOptional)) {
    return Status(StatusCode::kMissingKey,
                  "transfer_mode is required for a pdrouter registration with connector " +
                      std::string(to_string(reg->connector)));
  }
  return read_transfer_mode(reader, Need::kOptional, &reg->transfer_mode);
}

Status decode_labels(const FieldReader& reader, Labels* out) {
  FieldMap labels;
  bool present = false;
  if (Status s = reader.map("labels", &labels, &present); !s) return s;
  if (!present) return Status::ok();
  if (labels.entries().size() > kMaxLabels) {
    return Status(StatusCode::kTooLarge, "labels has " + std::to_string(labels.entries().size()) +
                                             " entries, limit " + std::to_string(kMaxLabels));
  }
  out->clear();
  for (const auto& [key, value] : labels.entries()) {
    if (key.empty()) return Status(StatusCode::kInvalidValue, "labels has an empty key");
    if (key.size() > kMaxLabelKeyBytes) {
      return Status(StatusCode::kTooLarge, "labels key " + quote_untrusted(key) + " is " +
                                               std::to_string(key.size()) + " bytes, limit " +
                                               std::to_string(kMaxLabelKeyBytes));
    }
    std::string text;
    const std::string name = "labels[" + quote_untrusted(key) + "]";
    if (Status s = as_string(*value, name, kMaxLabelValueBytes, &text); !s) return s;
    out->emplace_back(std::string(key), std::move(text));
  }
  std::sort(out->begin(), out->end());
  return Status::ok();
}

Status decode_load(const FieldReader& reader, NodeLoad* out) {
  FieldMap load;
  bool present = false;
  if (Status s = reader.map("load", &load, &present); !s) return s;
  if (!present) return Status::ok();
  const FieldReader load_reader(load, "load");
  NodeLoad parsed;
  parsed.present = true;
  if (Status s = load_reader.integer("running", Need::kOptional, 0, kMaxUint32, &parsed.running);
      !s) {
    return s;
  }
  if (Status s = load_reader.integer("waiting", Need::kOptional, 0, kMaxUint32, &parsed.waiting);
      !s) {
    return s;
  }
  if (Status s = load_reader.integer("free_kv_blocks", Need::kOptional, 0, kMaxUint64,
                                     &parsed.free_kv_blocks);
      !s) {
    return s;
  }
  *out = parsed;
  return Status::ok();
}

// An optional "tcp://host:port" key (parse_zmq_tcp_endpoint), the error naming the key.
Status decode_zmq_endpoint(const FieldReader& reader, std::string_view key,
                           std::optional<HostPort>* out) {
  std::string text;
  bool present = false;
  if (Status s = reader.string(key, Need::kOptional, kMaxZmqEndpointBytes, &text, &present); !s) {
    return s;
  }
  if (!present) return Status::ok();
  HostPort parsed;
  if (Status s = parse_zmq_tcp_endpoint(text, &parsed); !s) {
    return address_error(key, text, s);
  }
  *out = std::move(parsed);
  return Status::ok();
}

// An optional list of each DP rank's port beside a KV events endpoint (kv_events_ports,
// kv_events_replay_ports): dp_size entries, each 1..65535, entry 0 the endpoint's own port, so
// a router that does not know the key still reaches rank 0 where the node said.
Status decode_rank_ports(const FieldReader& reader, std::string_view key, std::string_view endpoint_key,
                         const std::optional<HostPort>& endpoint, uint32_t dp_size,
                         std::vector<uint16_t>* out) {
  const msgpack::object* value = reader.find(key, Need::kOptional);
  if (value == nullptr) return Status::ok();
  if (value->type != object_type::ARRAY) return wrong_type(key, "an array of ports", *value);
  if (!endpoint) {
    return Status(StatusCode::kMissingKey, std::string(key) + " needs " + std::string(endpoint_key));
  }
  const msgpack::object_array& items = value->via.array;
  if (items.size != dp_size) {
    return Status(StatusCode::kInvalidValue, std::string(key) + " has " + std::to_string(items.size) +
                                                 " ports for dp_size " + std::to_string(dp_size));
  }
  std::vector<uint16_t> ports;
  ports.reserve(items.size);
  for (uint32_t i = 0; i < items.size; ++i) {
    uint64_t port = 0;
    const std::string name = std::string(key) + "[" + std::to_string(i) + "]";
    if (Status s = as_uint(items.ptr[i], name, 1, kMaxPort, &port); !s) return s;
    ports.push_back(static_cast<uint16_t>(port));
  }
  if (ports[0] != endpoint->port) {
    return Status(StatusCode::kInvalidValue,
                  std::string(key) + "[0] " + std::to_string(ports[0]) + " is not " +
                      std::string(endpoint_key) + "'s port " + std::to_string(endpoint->port));
  }
  *out = std::move(ports);
  return Status::ok();
}

Status decode_extension(const FieldReader& reader, Registration* reg) {
  if (Status s =
          reader.string("instance_id", Need::kOptional, kMaxInstanceIdBytes, &reg->instance_id);
      !s) {
    return s;
  }
  if (Status s = reader.integer("epoch", Need::kOptional, 0, kMaxUint64, &reg->epoch); !s) return s;
  if (Status s = reader.string("model", Need::kOptional, kMaxModelBytes, &reg->model); !s) return s;
  if (Status s = reader.optional_integer("bootstrap_port", 1, kMaxPort, &reg->bootstrap_port); !s) {
    return s;
  }
  if (Status s = reader.string("engine_id", Need::kOptional, kMaxEngineIdBytes, &reg->engine_id); !s) return s;
  if (Status s = read_parallel_size(reader, "pp_size", Need::kOptional, &reg->pp_size); !s) return s;
  if (Status s = decode_zmq_endpoint(reader, "kv_events_endpoint", &reg->kv_events_endpoint); !s) {
    return s;
  }
  if (Status s = decode_zmq_endpoint(reader, "kv_events_replay_endpoint",
                                     &reg->kv_events_replay_endpoint);
      !s) {
    return s;
  }
  if (Status s = decode_rank_ports(reader, "kv_events_ports", "kv_events_endpoint",
                                  reg->kv_events_endpoint, reg->dp_size, &reg->kv_events_ports);
      !s) {
    return s;
  }
  if (Status s = decode_rank_ports(reader, "kv_events_replay_ports", "kv_events_replay_endpoint",
                                  reg->kv_events_replay_endpoint, reg->dp_size,
                                  &reg->kv_events_replay_ports);
      !s) {
    return s;
  }
  if (Status s = decode_labels(reader, &reg->labels); !s) return s;
  if (Status s = decode_load(reader, &reg->load); !s) return s;
  if (Status s = reader.boolean("draining", Need::kOptional, &reg->draining); !s) return s;
  if (Status s = reader.optional_integer("ttl_ms", 1, kMaxUint32, &reg->ttl_ms); !s) return s;
  return reader.string("auth", Need::kOptional, kMaxAuthBytes, &reg->auth_token);
}

// pdrouter registration: `type` P/D (role_from_type set) or HELLO (role from the `role` key).
Status decode_pdrouter(const FieldMap& fields, std::optional<Role> role_from_type,
                       Registration* reg) {
  const FieldReader reader(fields, kPdrouterContext);
  reg->format = RegistrationFormat::kPdrouter;
  if (Status s = read_schema_version(reader, &reg->schema_version); !s) return s;
  Role role_key = Role::kPrefill;
  bool has_role_key = false;
  const Need role_need = role_from_type ? Need::kOptional : Need::kRequired;
  if (Status s = read_role(reader, role_need, &role_key, &has_role_key); !s) return s;
  if (role_from_type && has_role_key && role_key != *role_from_type) {
    return Status(StatusCode::kInvalidValue, "role '" + std::string(to_string(role_key)) +
                                                 "' contradicts type '" +
                                                 std::string(to_string(*role_from_type)) + "'");
  }
  reg->role = role_from_type ? *role_from_type : role_key;
  if (Status s = decode_pdrouter_base(reader, reg); !s) return s;
  if (Status s = decode_extension(reader, reg); !s) return s;
  // A NIXL push decode is sent its prefill's engine id and side channel up front: a prefill that
  // does not say them cannot be paired (the dialect's facts say which connectors need them).
  const Dialect* dialect = any_dialect_of(reg->connector);
  if (dialect != nullptr && reg->role == Role::kPrefill) {
    const std::string name(to_string(reg->connector));
    if (dialect->zmq_address == ZmqAddressForm::kPrefillHostPort && !reg->kv_address) {
      return Status(StatusCode::kMissingKey,
                    "zmq_address (the KV side channel, host:port) is required for a " + name + " prefill");
    }
    if (dialect->prefill_needs_engine_id && reg->engine_id.empty()) {
      return Status(StatusCode::kMissingKey, "engine_id is required for a " + name + " prefill");
    }
  }
  return Status::ok();
}

// `type` P or D without `pdr_v`: MoRIIO current or P2P-NCCL, told apart by the zmq_address shape.
Status decode_vllm_registration(const FieldMap& fields, Role role, Registration* reg) {
  const FieldReader reader(fields, kPdContext);
  std::string zmq_text;
  if (Status s = reader.string("zmq_address", Need::kRequired, kNoExtraStringLimit, &zmq_text);
      !s) {
    return s;
  }
  if (looks_like_moriio_zmq_address(zmq_text)) {
    return decode_moriio_current(fields, role, std::move(zmq_text), reg);
  }
  return decode_p2p_nccl(fields, role, std::move(zmq_text), reg);
}

Status decode_goodbye(const FieldMap& fields, Goodbye* out) {
  const FieldReader reader(fields, kGoodbyeContext);
  if (Status s = read_host_port(reader, "http_address", Need::kRequired, &out->http_address); !s) {
    return s;
  }
  if (Status s = read_schema_version(reader, &out->schema_version); !s) return s;
  if (Status s =
          reader.string("instance_id", Need::kOptional, kMaxInstanceIdBytes, &out->instance_id);
      !s) {
    return s;
  }
  if (Status s = reader.integer("epoch", Need::kOptional, 0, kMaxUint64, &out->epoch); !s) return s;
  return reader.string("auth", Need::kOptional, kMaxAuthBytes, &out->auth_token);
}

// Shared front half of every decoder: bounded unpack, top-level map, string keys, no bin/ext.
Status decode_top_level_map(std::span<const std::byte> bytes, const DecodeLimits& limits,
                            msgpack::object_handle* handle, FieldMap* fields) {
  if (Status s = unpack_bounded(bytes, limits, handle); !s) return s;
  const msgpack::object& root = handle->get();
  if (root.type != object_type::MAP) {
    return Status(StatusCode::kWrongType,
                  "payload must be a msgpack map, got " + std::string(msgpack_type_name(root)));
  }
  if (Status s = FieldMap::build(root, "payload", fields); !s) return s;
  for (const auto& [key, value] : fields->entries()) {
    if (Status s = reject_bin_and_ext(*value, "key " + quote_untrusted(key)); !s) return s;
  }
  return Status::ok();
}

Status read_message_type(const FieldMap& fields, std::string* type) {
  const msgpack::object* value = fields.find("type");
  if (value == nullptr) return Status(StatusCode::kMissingKey, "type is required");
  return as_string(*value, "type", kNoExtraStringLimit, type);
}

Status decode_by_type(const FieldMap& fields, std::string_view type, DiscoveryMessage* out) {
  const bool has_schema_version = fields.has("pdr_v");
  if (type == "HELLO") {
    if (!has_schema_version) {
      out->kind = DiscoveryMessage::Kind::kHello;
      return Status::ok();
    }
    out->kind = DiscoveryMessage::Kind::kRegistration;
    return decode_pdrouter(fields, std::nullopt, &out->registration);
  }
  if (type == "goodbye") {
    out->kind = DiscoveryMessage::Kind::kGoodbye;
    return decode_goodbye(fields, &out->goodbye);
  }
  out->kind = DiscoveryMessage::Kind::kRegistration;
  if (type == "register") return decode_moriio_legacy(fields, &out->registration);
  if (type == "P" || type == "D") {
    const Role role = type == "P" ? Role::kPrefill : Role::kDecode;
    if (has_schema_version) return decode_pdrouter(fields, role, &out->registration);
    return decode_vllm_registration(fields, role, &out->registration);
  }
  return Status(StatusCode::kUnknownType, "unknown message type " + quote_untrusted(type));
}

Status decode_ack_fields(const FieldMap& fields, Ack* out) {
  const FieldReader reader(fields, kAckContext);
  std::string type;
  if (Status s = reader.string("type", Need::kRequired, kNoExtraStringLimit, &type); !s) return s;
  if (type != "ack") {
    return Status(StatusCode::kUnknownType, "expected type 'ack', got " + quote_untrusted(type));
  }
  uint32_t schema_version = 0;
  if (Status s = read_schema_version(reader, &schema_version); !s) return s;
  Ack ack;
  if (Status s = reader.boolean("ok", Need::kRequired, &ack.ok); !s) return s;
  if (Status s = reader.string("reason", Need::kOptional, kNoExtraStringLimit, &ack.reason); !s) {
    return s;
  }
  if (Status s = reader.integer("ttl_ms", Need::kOptional, 0, kMaxUint32, &ack.ttl_ms); !s)
    return s;
  if (Status s =
          reader.integer("registry_version", Need::kOptional, 0, kMaxUint64, &ack.registry_version);
      !s) {
    return s;
  }
  *out = std::move(ack);
  return Status::ok();
}

}  // namespace

Status decode_discovery_message(std::span<const std::byte> bytes, const DecodeLimits& limits,
                                DiscoveryMessage* out) {
  msgpack::object_handle handle;
  FieldMap fields;
  if (Status s = decode_top_level_map(bytes, limits, &handle, &fields); !s) return s;
  std::string type;
  if (Status s = read_message_type(fields, &type); !s) return s;
  *out = DiscoveryMessage{};
  return decode_by_type(fields, type, out);
}

Status decode_ack(std::span<const std::byte> bytes, Ack* out) {
  msgpack::object_handle handle;
  FieldMap fields;
  if (Status s = decode_top_level_map(bytes, DecodeLimits{}, &handle, &fields); !s) return s;
  return decode_ack_fields(fields, out);
}

}  // namespace pdr::proto
