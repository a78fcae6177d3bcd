// Construction of the two upstream legs (prefill, decode) of one client request: path, headers
// and body for each, plus the plan (serial or concurrent, whether decode needs the prefill's
// response first). What differs per connector dialect lives in one file per dialect behind the
// table of proto/dialects/dialect.h; this file does what all of them share. Pure functions over
// bytes; randomness is injected so tests are deterministic. The facts each dialect follows are in
// docs/design/wire-formats.md; the table of what each leg gets is proto/REQUEST_LEGS.md.
//
// Bodies are built by splicing the few changed top-level fields into the client's original bytes
// (proto/json_splice.h): every other byte of the client body reaches the nodes unchanged. The
// client body is parsed once (ClientRequest::parsed); each leg's body stays unrendered (the
// client's bytes, shared, plus the edits) until it is written out (LegRequest::body).
//
// Errors (the router answers 400 with Status::message() for the client-caused ones):
//   kMalformed / kTooLarge / kTooDeep / kWrongType / kInvalidValue  client body is not valid JSON,
//       not an object, has duplicate keys, or max_tokens / max_completion_tokens is neither an
//       integer nor null
//   kOutOfRange   max_tokens outside int64, or a DP rank not below the instance's dp_size
//   kNotFound     the path is not /v1/completions, /v1/chat/completions, /v1/responses,
//                 /v1/messages or /inference/v1/generate (whose body errors are
//                 check_generate_request's; /v1/messages's are check_messages_request's)
//   kRejected     the pair is not buildable: connectors differ, unknown connector or no dialect
//       for it (dialect_for), MoRIIO modes
//       differ or are unset, a MoRIIO/P2P instance without zmq_address, a MoRIIO/Mooncake prefill
//       with dp_size > 1 but no chosen rank, Mooncake without an engine id (router-side problems:
//       answer 503, not 400), or an endpoint the dialect does not serve (unsupported_endpoint:
//       the router answers 501 before building)
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/address.h"
#include "proto/dialects/dialect.h"
#include "proto/discovery_message.h"
#include "proto/generate_request.h"
#include "proto/json_splice.h"
#include "proto/node_spec.h"
#include "proto/base/status.h"

namespace pdr::proto {

// What the leg builder needs to know about one chosen instance: its NodeEndpoint (for Mooncake
// bootstrap_port is the bootstrap server port, default 8998; for SGLang the prefill's bootstrap
// port, nullopt -> JSON null) plus what is chosen per request.
struct LegInstance : NodeEndpoint {
  // Mooncake prefill: engine_id of the chosen DP rank from the bootstrap /query table.
  std::string mooncake_engine_id;
  // SGLang / Mooncake: host for bootstrap_host / remote_bootstrap_addr; empty -> http_address.host.
  std::string bootstrap_host;
};

struct ClientRequest {
  // "/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages" or
  // "/inference/v1/generate"
  std::string_view path;
  std::string_view body;           // the client's JSON bytes
  std::string_view authorization;  // the client's Authorization header value; empty if none
  // The body already parsed (the session parses it once for admission and every build); null:
  // build_legs parses `body` itself.
  const JsonObjectBody* parsed = nullptr;
  // /inference/v1/generate: check_generate_request's view of `parsed` (the session checks the
  // body once at admission); build_legs then neither checks nor parses its sampling_params
  // again. Null: build_legs checks the body itself. Ignored for the other paths and when
  // `parsed` is null.
  const GenerateView* generate = nullptr;
};

struct LegOptions {
  // Authorization on both legs: "Bearer <upstream_api_key>" when set, else the client's header
  // when forward_client_authorization, else none.
  std::optional<std::string> upstream_api_key;
  bool forward_client_authorization = true;
  // MoRIIO: also send the peer's remote_host / remote_handshake_port / remote_notify_port (they
  // take precedence over the request-id parse on the node and are what older nodes expect).
  bool moriio_send_remote_addresses = true;
  // Mooncake: the bootstrap port of a prefill that registered none (the topology's
  // connectors.mooncake_bootstrap_port; VLLM_MOONCAKE_BOOTSTRAP_PORT defaults to 8998).
  uint16_t default_bootstrap_port = 8998;
  JsonLimits limits;
};

struct LegRequest {
  LegRequest() = default;
  LegRequest(const LegRequest&) = default;
  LegRequest& operator=(const LegRequest&) = default;
  LegRequest(LegRequest&&) noexcept = default;
  LegRequest& operator=(LegRequest&&) noexcept = default;
  // Gives the storage of `headers` (the vector and its strings) to the thread's spares, which
  // the next build_legs() on the thread reuses: no allocation per leg for its headers once warm.
  ~LegRequest();

  std::string_view path;  // "/v1/completions" or "/v1/chat/completions" (static text)
  std::vector<std::pair<std::string, std::string>> headers;
  // Unrendered: the client's bytes (shared with the other leg) plus this leg's edits. Render it
  // when it is sent (body.render_into() straight into the wire buffer).
  JsonObjectBody body;

  std::string body_text() const { return body.render(); }

  // First header value with this name (case-insensitive), or nullptr.
  const std::string* header(std::string_view name) const;
};

struct LegPlan {
  const Dialect* dialect = nullptr;  // of the pair (proto/dialects/dialect.h)
  Connector connector = Connector::kUnknown;
  TransferMode transfer_mode = TransferMode::kNone;
  // true: send prefill and decode at once (MoRIIO WRITE, Mooncake, SGLang); the prefill response
  // is read and discarded. false: send prefill, wait for its complete response, then decode.
  bool concurrent = false;
  // Serial dialects whose decode body must be completed from the prefill response with
  // finish_decode_leg() before sending (NIXL, MoRIIO READ). P2P-NCCL is serial but false here.
  bool decode_needs_prefill_params = false;
  // The hosts of the pair's http_address: what the prefill's answer may name as its own side
  // channel (Dialect::finish_decode checks it against them).
  std::string prefill_host;
  std::string decode_host;
  std::string request_id;   // X-Request-Id on both legs
  std::string transfer_id;  // MoRIIO "tx-<uuid>", Mooncake "xfer-<request id>"; else empty
  std::optional<uint64_t> bootstrap_room;  // SGLang
  // POST /inference/v1/generate (proto/generate_request.h): token counts and a copy of
  // kv_transfer_params live in sampling_params; finish_decode_leg and decode_without_kv keep
  // the copy in step.
  bool tokens_in = false;
};

struct LegBuild {
  LegRequest prefill;
  LegRequest decode;
  LegPlan plan;
};

// Builds both legs. `prefill_dp_rank` / `decode_dp_rank` are the ranks chosen by the routing
// policy (nullopt: none chosen). X-data-parallel-rank goes on a leg only when a rank was chosen and
// that instance's dp_size > 1; a rank >= the instance's dp_size is kOutOfRange.
Status build_legs(const ClientRequest& request, const LegInstance& prefill,
                  const LegInstance& decode, std::optional<uint32_t> prefill_dp_rank,
                  std::optional<uint32_t> decode_dp_rank, const LegOptions& options,
                  const RandomSource& random, LegBuild* out);

// Completes the decode body from the prefill's JSON response (serial dialects with
// decode_needs_prefill_params: Dialect::finish_decode). NIXL: copies the response's top-level
// kv_transfer_params bytes verbatim into the decode body, once its remote_host names the prefill
// itself (kRejected otherwise, see proto/dialects/nixl.cc). MoRIIO READ: copies remote_engine_id,
// remote_block_ids, transfer_id and tp_size (if present) from it into the decode's
// kv_transfer_params.
// Errors leave *decode unchanged:
//   kMalformed/...  the response is not a JSON object
//   kMissingKey     kv_transfer_params absent, null or {} (the prefill did not export KV, e.g. EOS
//                   on the first token) — the router decides (NIXL's proxy sends decode anyway
//                   and lets it recompute; for MoRIIO READ that would hang, so fail/retry)
//   kWrongType      kv_transfer_params is not an object
//   kMissingKey     MoRIIO READ: remote_block_ids or remote_engine_id missing
//   kRejected       NIXL: remote_host is not the prefill's registered host (nor loopback with
//                   both nodes on one host); kWrongType: remote_host is not a string
// For other dialects it does nothing and returns OK.
Status finish_decode_leg(const LegPlan& plan, LegRequest* decode,
                         std::string_view prefill_response_json,
                         const JsonLimits& limits = JsonLimits());

// Why `dialect` cannot serve the P/D path `path` (its tokens_in_unsupported for
// /inference/v1/generate, its messages_unsupported for /v1/messages), or "" when it can.
std::string_view unsupported_endpoint(const Dialect& dialect, std::string_view path);

// The no-KV fallback (Dialect::without_kv): after finish_decode_leg answered kMissingKey, turns
// the decode into the dialect's plain request. False when the dialect has none (the prefill's
// answer is then a failure).
bool decode_without_kv(const LegPlan& plan, LegRequest* decode);

// uuid4 from the injected randomness (version 4, RFC 4122 variant).
struct Uuid4 {
  uint8_t bytes[16] = {};
  std::string hex() const;     // 32 lowercase hex chars (Python uuid4().hex)
  std::string dashed() const;  // 8-4-4-4-12 lowercase (Python str(uuid4()))
};
Uuid4 make_uuid4(const RandomSource& random);

// "___prefill_addr_{P}___decode_addr_{D}_{32 hex}" (docs/design/wire-formats.md 1.3 step 3, section 2).
std::string make_addressed_request_id(std::string_view prefill_zmq, std::string_view decode_zmq,
                                      const Uuid4& uuid);

// "http://host:port", IPv6 literal bracketed.
std::string http_origin(std::string_view host, uint16_t port);

}  // namespace pdr::proto
