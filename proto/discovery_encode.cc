// Encoding of pdrouter's outgoing discovery messages (contract: discovery_message.h). The bytes
// are meant to equal Python's msgpack.packb of the same dict, key order included; the tests check
// them against vectors from tests/fuzz/make_corpus.py.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <msgpack.hpp>

#include "proto/discovery_message.h"
#include "proto/msgpack_fields.h"

namespace pdr::proto {

namespace {


// Builds a msgpack map: entries are counted while packed and the header is prepended at the end
// (msgpack needs the count up front). Strings go out as str, integers in their smallest form, as
// Python's msgpack.packb does.
class MapWriter {
 public:
  MapWriter() : packer_(body_) {}

  // Packs `key` as the next entry's key and returns the packer for its value.
  Packer& key(std::string_view key) {
    ++entries_;
    pack_string(packer_, key);
    return packer_;
  }
  void add(std::string_view name, std::string_view value) { pack_string(key(name), value); }
  void add(std::string_view name, uint64_t value) { key(name).pack_uint64(value); }
  void add_ports(std::string_view name, const std::vector<uint16_t>& ports) {
    Packer& packer = key(name);
    packer.pack_array(static_cast<uint32_t>(ports.size()));
    for (uint16_t port : ports) packer.pack_uint16(port);
  }
  void add_bool(std::string_view name, bool value) {
    if (value) {
      key(name).pack_true();
    } else {
      key(name).pack_false();
    }
  }

  std::string finish() const {
    StringBuffer header;
    Packer(header).pack_map(entries_);
    return header.data + body_.data;
  }

 private:
  StringBuffer body_;
  Packer packer_;
  uint32_t entries_ = 0;
};

std::string_view role_letter(Role role) { return role == Role::kPrefill ? "P" : "D"; }

std::string moriio_zmq_text(const Registration& reg) {
  if (!reg.zmq_address.empty() || !reg.moriio_zmq) return reg.zmq_address;
  return reg.moriio_zmq->to_string();
}

// Key order matches the dict vLLM's MoRIIO connector builds, so our bytes equal Python's.
std::string encode_moriio_current(const Registration& reg) {
  MapWriter map;
  map.add("type", role_letter(reg.role));
  map.add("http_address", reg.http_address.to_string());
  map.add("zmq_address", moriio_zmq_text(reg));
  map.add("dp_size", uint64_t{reg.dp_size});
  map.add("tp_size", uint64_t{reg.tp_size});
  map.add("transfer_mode", to_string(reg.transfer_mode));
  return map.finish();
}

std::string encode_moriio_legacy(const Registration& reg) {
  const MoriioZmqAddress zmq = reg.moriio_zmq.value_or(MoriioZmqAddress{});
  MapWriter map;
  map.add("type", std::string_view("register"));
  map.add("role", role_letter(reg.role));
  map.add("index", reg.legacy_index);
  map.add("request_address", "http://" + reg.http_address.to_string() + "/v1/completions");
  map.add("handshake_port", uint64_t{zmq.handshake_port});
  map.add("notify_port", uint64_t{zmq.notify_port});
  map.add("dp_size", uint64_t{reg.dp_size});
  map.add("tp_size", uint64_t{reg.tp_size});
  map.add("transfer_mode", to_string(reg.transfer_mode));
  return map.finish();
}

std::string encode_p2p_nccl(const Registration& reg) {
  MapWriter map;
  map.add("type", role_letter(reg.role));
  map.add("http_address", reg.http_address.to_string());
  map.add("zmq_address", reg.zmq_address);
  return map.finish();
}

void add_labels(const Labels& labels, MapWriter* map) {
  Packer& packer = map->key("labels");
  packer.pack_map(static_cast<uint32_t>(labels.size()));
  for (const auto& [key, value] : labels) {
    pack_string(packer, key);
    pack_string(packer, value);
  }
}

void add_load(const NodeLoad& load, MapWriter* map) {
  Packer& packer = map->key("load");
  packer.pack_map(3);
  pack_string(packer, "running");
  packer.pack_uint32(load.running);
  pack_string(packer, "waiting");
  packer.pack_uint32(load.waiting);
  pack_string(packer, "free_kv_blocks");
  packer.pack_uint64(load.free_kv_blocks);
}

uint64_t wire_schema_version(uint32_t version) { return version == 0 ? 1 : version; }

void add_extension(const Registration& reg, MapWriter* map) {
  map->add("pdr_v", wire_schema_version(reg.schema_version));
  // kUnknown is left out so the router infers the connector from zmq_address, as it does for a
  // node that never names one, unless the node has none (no_connector): that is said.
  if (reg.connector != Connector::kUnknown) {
    map->add("connector", to_string(reg.connector));
  } else if (reg.no_connector) {
    map->add("connector", std::string_view("none"));
  }
  if (!reg.instance_id.empty()) map->add("instance_id", reg.instance_id);
  if (reg.epoch != 0) map->add("epoch", reg.epoch);
  if (!reg.model.empty()) map->add("model", reg.model);
  if (reg.bootstrap_port) map->add("bootstrap_port", uint64_t{*reg.bootstrap_port});
  if (!reg.engine_id.empty()) map->add("engine_id", reg.engine_id);
  if (reg.pp_size != 1) map->add("pp_size", uint64_t{reg.pp_size});
  if (reg.kv_events_endpoint) map->add("kv_events_endpoint", zmq_tcp_endpoint(*reg.kv_events_endpoint));
  if (reg.kv_events_replay_endpoint) {
    map->add("kv_events_replay_endpoint", zmq_tcp_endpoint(*reg.kv_events_replay_endpoint));
  }
  if (!reg.kv_events_ports.empty()) map->add_ports("kv_events_ports", reg.kv_events_ports);
  if (!reg.kv_events_replay_ports.empty()) {
    map->add_ports("kv_events_replay_ports", reg.kv_events_replay_ports);
  }
  if (!reg.labels.empty()) add_labels(reg.labels, map);
  if (reg.load.present) add_load(reg.load, map);
  if (reg.draining) map->add_bool("draining", true);
  if (reg.ttl_ms) map->add("ttl_ms", uint64_t{*reg.ttl_ms});
  if (!reg.auth_token.empty()) map->add("auth", reg.auth_token);
}

// MoRIIO-current base keys first, so the toy proxy and vLLM-style parsers that ignore unknown keys
// still understand the message. `extra`: string entries appended last.
std::string encode_pdrouter(const Registration& reg, std::span<const std::pair<std::string_view, std::string_view>> extra = {}) {
  MapWriter map;
  map.add("type", role_letter(reg.role));
  map.add("http_address", reg.http_address.to_string());
  const std::string zmq =
      reg.connector == Connector::kMoriio ? moriio_zmq_text(reg) : reg.zmq_address;
  if (!zmq.empty()) map.add("zmq_address", zmq);
  map.add("dp_size", uint64_t{reg.dp_size});
  map.add("tp_size", uint64_t{reg.tp_size});
  if (reg.transfer_mode != TransferMode::kNone)
    map.add("transfer_mode", to_string(reg.transfer_mode));
  add_extension(reg, &map);
  for (const auto& [key, value] : extra) map.add(key, value);
  return map.finish();
}

}  // namespace

std::string encode_pdrouter_registration(const Registration& reg,
                                         std::span<const std::pair<std::string_view, std::string_view>> extra) {
  return encode_pdrouter(reg, extra);
}

std::string encode_registration(const Registration& reg) {
  switch (reg.format) {
    case RegistrationFormat::kMoriio: return encode_moriio_current(reg);
    case RegistrationFormat::kMoriioLegacy: return encode_moriio_legacy(reg);
    case RegistrationFormat::kP2pNccl: return encode_p2p_nccl(reg);
    case RegistrationFormat::kPdrouter: return encode_pdrouter(reg);
    case RegistrationFormat::kStatic: return {};
  }
  return {};
}

std::string encode_goodbye(const Goodbye& goodbye) {
  MapWriter map;
  map.add("type", std::string_view("goodbye"));
  map.add("pdr_v", wire_schema_version(goodbye.schema_version));
  map.add("http_address", goodbye.http_address.to_string());
  if (!goodbye.instance_id.empty()) map.add("instance_id", goodbye.instance_id);
  if (goodbye.epoch != 0) map.add("epoch", goodbye.epoch);
  if (!goodbye.auth_token.empty()) map.add("auth", goodbye.auth_token);
  return map.finish();
}

std::string encode_ack(const Ack& ack) {
  MapWriter map;
  map.add("type", std::string_view("ack"));
  map.add("pdr_v", uint64_t{1});
  map.add_bool("ok", ack.ok);
  map.add("reason", ack.reason);
  map.add("ttl_ms", uint64_t{ack.ttl_ms});
  map.add("registry_version", ack.registry_version);
  return map.finish();
}

}  // namespace pdr::proto
