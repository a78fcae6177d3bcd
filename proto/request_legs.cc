#include "proto/request_legs.h"

#include <cstdint>
#include <limits>
#include <string>

#include "base/ascii.h"

namespace pdr::proto {
namespace {

constexpr uint16_t kMooncakeDefaultBootstrapPort = 8998;  // VLLM_MOONCAKE_BOOTSTRAP_PORT default

std::string bracket_host(std::string_view host) {
  if (host.find(':') != std::string_view::npos) return "[" + std::string(host) + "]";
  return std::string(host);
}

// Validates the token-count fields the builders read or rewrite: integer or null.
Status check_token_fields(const JsonObjectBody& body) {
  for (std::string_view key : {"max_tokens", "max_completion_tokens"}) {
    if (body.is_null(key)) continue;
    std::optional<int64_t> v;
    Status st = body.get_int(key, &v);
    if (!st) return st;
  }
  return Status::ok();
}

// PROTOCOLS.md 3 (NIXL toy proxy), 1.3 step 5 (MoRIIO), 4 (Mooncake); Implications item 7.
void apply_prefill_edits(JsonObjectBody* body) {
  body->set_raw("stream", "false");
  body->set_raw("max_tokens", "1");
  if (body->has("max_completion_tokens")) body->set_raw("max_completion_tokens", "1");
  body->remove("stream_options");
  body->remove("min_tokens");
  body->remove("min_completion_tokens");
}

// MoRIIO decode: max_completion_tokens -= 1 if it is an integer, else max_tokens -= 1 if it is an
// integer (PROTOCOLS.md 1.3 step 6). Values <= 1 are left as they are: vLLM rejects max_tokens < 1,
// and at 1 the client asked for a single token, which the decode still produces.
void decrement_decode_tokens(JsonObjectBody* body) {
  for (std::string_view key : {"max_completion_tokens", "max_tokens"}) {
    if (!body->has(key) || body->is_null(key)) continue;
    std::optional<int64_t> v;
    if (!body->get_int(key, &v) || !v) continue;  // validated earlier
    if (*v > 1) body->set_raw(key, json_int(*v - 1));
    return;
  }
}

void add_common_headers(const ClientRequest& request, const LegOptions& options,
                        const std::string& request_id, LegRequest* leg) {
  leg->path = std::string(request.path);
  leg->headers.emplace_back("Content-Type", "application/json");
  if (options.upstream_api_key) {
    leg->headers.emplace_back("Authorization", "Bearer " + *options.upstream_api_key);
  } else if (options.forward_client_authorization && !request.authorization.empty()) {
    leg->headers.emplace_back("Authorization", std::string(request.authorization));
  }
  leg->headers.emplace_back("X-Request-Id", request_id);
}

void add_dp_rank_header(const LegInstance& inst, std::optional<uint32_t> rank, LegRequest* leg) {
  if (rank && inst.dp_size > 1) leg->headers.emplace_back("X-data-parallel-rank", std::to_string(*rank));
}

Status resolve_moriio_zmq(const LegInstance& inst, const char* which, MoriioZmqAddress* out) {
  if (inst.moriio_zmq) {
    *out = *inst.moriio_zmq;
    return Status::ok();
  }
  Status st = parse_moriio_zmq_address(inst.zmq_address, out);
  if (!st) {
    return Status(StatusCode::kRejected,
                  std::string(which) + " MoRIIO instance has no usable zmq_address: " + st.message());
  }
  return Status::ok();
}

void add_remote_addresses(JsonObjectWriter* w, const MoriioZmqAddress& peer) {
  w->string("remote_host", peer.host)
      .integer("remote_handshake_port", peer.handshake_port)
      .integer("remote_notify_port", peer.notify_port);
}

Status build_moriio(const LegInstance& p, const LegInstance& d, std::optional<uint32_t> p_rank,
                    const LegOptions& options, const RandomSource& random,
                    JsonObjectBody* prefill_body, JsonObjectBody* decode_body, LegPlan* plan) {
  if (p.transfer_mode != d.transfer_mode || p.transfer_mode == TransferMode::kNone) {
    return Status(StatusCode::kRejected,
                  "MoRIIO prefill and decode transfer modes must both be READ or both WRITE (got " +
                      std::string(to_string(p.transfer_mode)) + " and " +
                      std::string(to_string(d.transfer_mode)) + ")");
  }
  if (p.dp_size > 1 && !p_rank) {
    return Status(StatusCode::kRejected,
                  "MoRIIO prefill has dp_size > 1 but no DP rank was chosen");
  }
  MoriioZmqAddress pz, dz;
  if (Status st = resolve_moriio_zmq(p, "prefill", &pz); !st) return st;
  if (Status st = resolve_moriio_zmq(d, "decode", &dz); !st) return st;

  plan->request_id = make_addressed_request_id(p.zmq_address, d.zmq_address, make_uuid4(random));
  plan->transfer_id = "tx-" + make_uuid4(random).dashed();
  plan->concurrent = p.transfer_mode == TransferMode::kWrite;
  plan->decode_needs_prefill_params = p.transfer_mode == TransferMode::kRead;

  JsonObjectWriter pk;
  pk.integer("remote_dp_size", d.dp_size)
      .integer("remote_tp_size", d.tp_size)
      .string("transfer_id", plan->transfer_id)
      .boolean("do_remote_decode", true)
      .boolean("do_remote_prefill", false)
      .null("remote_engine_id")
      .null("remote_block_ids");
  if (options.moriio_send_remote_addresses) add_remote_addresses(&pk, dz);
  prefill_body->set_raw("kv_transfer_params", pk.finish());
  apply_prefill_edits(prefill_body);

  JsonObjectWriter dk;
  dk.boolean("do_remote_decode", false)
      .boolean("do_remote_prefill", true)
      .null("remote_engine_id")
      .null("remote_block_ids")
      .string("transfer_id", plan->transfer_id)
      .integer("remote_dp_size", p.dp_size)
      .integer("remote_tp_size", p.tp_size);
  if (p.dp_size > 1) dk.integer("remote_dp_rank", *p_rank);
  if (options.moriio_send_remote_addresses) add_remote_addresses(&dk, pz);
  decrement_decode_tokens(decode_body);
  decode_body->set_raw("kv_transfer_params", dk.finish());
  return Status::ok();
}

}  // namespace

const std::string* LegRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return &v;
  }
  return nullptr;
}

Uuid4 make_uuid4(const RandomSource& random) {
  Uuid4 u;
  const uint64_t hi = random();
  const uint64_t lo = random();
  for (int i = 0; i < 8; ++i) {
    u.bytes[i] = static_cast<uint8_t>(hi >> (56 - 8 * i));
    u.bytes[8 + i] = static_cast<uint8_t>(lo >> (56 - 8 * i));
  }
  u.bytes[6] = static_cast<uint8_t>((u.bytes[6] & 0x0F) | 0x40);  // version 4
  u.bytes[8] = static_cast<uint8_t>((u.bytes[8] & 0x3F) | 0x80);  // RFC 4122 variant
  return u;
}

std::string Uuid4::hex() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (uint8_t b : bytes) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 0xF]);
  }
  return out;
}

std::string Uuid4::dashed() const {
  const std::string h = hex();
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20, 12);
}

std::string make_addressed_request_id(std::string_view prefill_zmq, std::string_view decode_zmq,
                                      const Uuid4& uuid) {
  std::string id = "___prefill_addr_";
  id.append(prefill_zmq);
  id.append("___decode_addr_");
  id.append(decode_zmq);
  id.push_back('_');
  id.append(uuid.hex());
  return id;
}

std::string http_origin(std::string_view host, uint16_t port) {
  return "http://" + bracket_host(host) + ":" + std::to_string(port);
}

Status build_legs(const ClientRequest& request, const LegInstance& p, const LegInstance& d,
                  std::optional<uint32_t> p_rank, std::optional<uint32_t> d_rank,
                  const LegOptions& options, const RandomSource& random, LegBuild* out) {
  *out = LegBuild();
  if (request.path != "/v1/completions" && request.path != "/v1/chat/completions") {
    return Status(StatusCode::kNotFound, "P/D routing serves /v1/completions and "
                                         "/v1/chat/completions only, not " +
                                             std::string(request.path.substr(0, 64)));
  }
  if (p.connector != d.connector) {
    return Status(StatusCode::kRejected, "prefill connector " + std::string(to_string(p.connector)) +
                                             " does not match decode connector " +
                                             std::string(to_string(d.connector)));
  }
  if (p.connector == Connector::kUnknown) {
    return Status(StatusCode::kRejected, "connector dialect of the pair is unknown");
  }
  if (p_rank && *p_rank >= p.dp_size) {
    return Status(StatusCode::kOutOfRange, "prefill DP rank " + std::to_string(*p_rank) +
                                               " is not below its dp_size " +
                                               std::to_string(p.dp_size));
  }
  if (d_rank && *d_rank >= d.dp_size) {
    return Status(StatusCode::kOutOfRange, "decode DP rank " + std::to_string(*d_rank) +
                                               " is not below its dp_size " +
                                               std::to_string(d.dp_size));
  }

  JsonObjectBody prefill_body;
  if (Status st = JsonObjectBody::parse(request.body, options.limits, &prefill_body); !st) return st;
  if (Status st = check_token_fields(prefill_body); !st) return st;
  JsonObjectBody decode_body = prefill_body;
  bool decode_is_original = false;  // decode body = client bytes, untouched
  LegPlan& plan = out->plan;
  plan.connector = p.connector;
  plan.transfer_mode = p.transfer_mode;

  switch (p.connector) {
    case Connector::kNixl: {
      // PROTOCOLS.md 3: serial; decode gets the prefill's kv_transfer_params via finish_decode_leg.
      plan.request_id = make_uuid4(random).dashed();
      plan.concurrent = false;
      plan.decode_needs_prefill_params = true;
      prefill_body.set_raw("kv_transfer_params", JsonObjectWriter()
                                                     .boolean("do_remote_decode", true)
                                                     .boolean("do_remote_prefill", false)
                                                     .null("remote_engine_id")
                                                     .null("remote_block_ids")
                                                     .null("remote_host")
                                                     .null("remote_port")
                                                     .finish());
      apply_prefill_edits(&prefill_body);
      decode_is_original = true;
      break;
    }
    case Connector::kMoriio: {
      if (Status st = build_moriio(p, d, p_rank, options, random, &prefill_body, &decode_body, &plan);
          !st) {
        return st;
      }
      break;
    }
    case Connector::kMooncake: {
      // PROTOCOLS.md 4: concurrent; P pushes to D using the bootstrap table.
      if (p.dp_size > 1 && !p_rank) {
        return Status(StatusCode::kRejected,
                      "Mooncake prefill has dp_size > 1 but no DP rank was chosen");
      }
      if (p.mooncake_engine_id.empty()) {
        return Status(StatusCode::kRejected,
                      "Mooncake prefill has no engine_id for the chosen DP rank (bootstrap /query "
                      "not answered yet)");
      }
      plan.request_id = make_uuid4(random).dashed();
      plan.transfer_id = "xfer-" + plan.request_id;
      plan.concurrent = true;
      const std::string& host = p.bootstrap_host.empty() ? p.http_address.host : p.bootstrap_host;
      const std::string bootstrap =
          http_origin(host, p.bootstrap_port.value_or(kMooncakeDefaultBootstrapPort));
      prefill_body.set_raw("kv_transfer_params", JsonObjectWriter()
                                                     .boolean("do_remote_decode", true)
                                                     .boolean("do_remote_prefill", false)
                                                     .string("transfer_id", plan.transfer_id)
                                                     .finish());
      apply_prefill_edits(&prefill_body);
      decode_body.set_raw("kv_transfer_params", JsonObjectWriter()
                                                    .boolean("do_remote_decode", false)
                                                    .boolean("do_remote_prefill", true)
                                                    .string("remote_bootstrap_addr", bootstrap)
                                                    .string("remote_engine_id", p.mooncake_engine_id)
                                                    .string("transfer_id", plan.transfer_id)
                                                    .finish());
      break;
    }
    case Connector::kP2pNccl: {
      // PROTOCOLS.md 2: serial, no kv params, stream untouched on prefill, decode = original.
      if (p.zmq_address.empty() || d.zmq_address.empty()) {
        return Status(StatusCode::kRejected, "P2P-NCCL instances need a zmq_address");
      }
      plan.request_id = make_addressed_request_id(p.zmq_address, d.zmq_address, make_uuid4(random));
      plan.concurrent = false;
      prefill_body.set_raw("max_tokens", "1");
      if (prefill_body.has("max_completion_tokens")) prefill_body.set_raw("max_completion_tokens", "1");
      // Not in the reference proxy, but Implications 7: vLLM refuses min_tokens > max_tokens, so a
      // client's min_tokens >= 2 would fail the prefill leg with a 400.
      prefill_body.remove("min_tokens");
      prefill_body.remove("min_completion_tokens");
      // The connector ignores kv_transfer_params (PROTOCOLS.md 2), but a client's own must not
      // reach the nodes either (security review #22): every other dialect overwrites it.
      if (prefill_body.has("kv_transfer_params")) {
        prefill_body.remove("kv_transfer_params");
        decode_body.remove("kv_transfer_params");
      } else {
        decode_is_original = true;
      }
      break;
    }
    case Connector::kSglang: {
      // PROTOCOLS.md 7: concurrent; the same body to both legs.
      plan.request_id = make_uuid4(random).dashed();
      plan.concurrent = true;
      plan.bootstrap_room = random() & static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      const std::string& host = p.bootstrap_host.empty() ? p.http_address.host : p.bootstrap_host;
      prefill_body.set_raw("bootstrap_host", json_string(bracket_host(host)));
      prefill_body.set_raw("bootstrap_port",
                           p.bootstrap_port ? json_int(*p.bootstrap_port) : json_null());
      prefill_body.set_raw("bootstrap_room", json_uint(*plan.bootstrap_room));
      decode_body = prefill_body;
      break;
    }
    case Connector::kUnknown:
      break;  // rejected above
  }

  out->prefill.body = prefill_body.render();
  out->decode.body = decode_is_original ? std::string(request.body) : decode_body.render();
  add_common_headers(request, options, plan.request_id, &out->prefill);
  add_common_headers(request, options, plan.request_id, &out->decode);
  add_dp_rank_header(p, p_rank, &out->prefill);
  add_dp_rank_header(d, d_rank, &out->decode);
  return Status::ok();
}

Status finish_decode_leg(const LegPlan& plan, LegRequest* decode,
                         std::string_view prefill_response_json, const JsonLimits& limits) {
  const bool nixl = plan.connector == Connector::kNixl;
  const bool moriio_read =
      plan.connector == Connector::kMoriio && plan.transfer_mode == TransferMode::kRead;
  if (!nixl && !moriio_read) return Status::ok();

  JsonObjectBody response;
  if (Status st = JsonObjectBody::parse(prefill_response_json, limits, &response); !st) {
    return Status(st.code(), "prefill response: " + st.message());
  }
  const auto raw = response.get_raw("kv_transfer_params");
  if (!raw || *raw == "null") {
    return Status(StatusCode::kMissingKey,
                  "prefill response has no kv_transfer_params (prefill did not export KV, e.g. "
                  "it stopped before the length cap)");
  }
  if (raw->front() != '{') {
    return Status(StatusCode::kWrongType, "prefill response kv_transfer_params is not an object");
  }
  JsonObjectBody params;
  if (Status st = JsonObjectBody::parse(*raw, limits, &params); !st) {
    return Status(st.code(), "prefill response kv_transfer_params: " + st.message());
  }
  if (params.size() == 0) {
    return Status(StatusCode::kMissingKey, "prefill response kv_transfer_params is empty");
  }

  JsonObjectBody body;
  if (Status st = JsonObjectBody::parse(decode->body, limits, &body); !st) {
    return Status(StatusCode::kInternal, "decode body: " + st.message());
  }
  if (nixl) {
    // Verbatim: newer vLLM adds keys (remote_request_id, dcp_size, ...) that decode needs.
    body.set_raw("kv_transfer_params", *raw);
    decode->body = body.render();
    return Status::ok();
  }

  for (std::string_view key : {"remote_engine_id", "remote_block_ids"}) {
    if (!params.has(key) || params.is_null(key)) {
      return Status(StatusCode::kMissingKey,
                    "prefill response kv_transfer_params lacks " + std::string(key));
    }
  }
  const auto decode_raw = body.get_raw("kv_transfer_params");
  JsonObjectBody decode_params;
  if (!decode_raw ||
      !JsonObjectBody::parse(*decode_raw, limits, &decode_params).is_ok()) {
    return Status(StatusCode::kInternal, "decode body has no kv_transfer_params object");
  }
  for (std::string_view key : {"remote_engine_id", "remote_block_ids", "transfer_id", "tp_size"}) {
    if (const auto v = params.get_raw(key)) decode_params.set_raw(key, *v);
  }
  body.set_raw("kv_transfer_params", decode_params.render());
  decode->body = body.render();
  return Status::ok();
}

}  // namespace pdr::proto
