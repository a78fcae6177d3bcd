// One connector dialect as a plug-in: a table line of facts plus a few callbacks (in the spirit
// of h2o's balancer callbacks). Everything the router does differently per dialect is here:
// how the two legs are built and ordered, what the decode leg takes from the prefill's answer,
// what it becomes when the prefill exported no KV, which decode failures may be retried on
// another decode alone, which instances pair with which, which instance fields the connector
// needs, the pre-step the router runs before building the legs, and whether a conversation's
// next turn may reuse the decode's KV. The connector's names are proto/connectors.h's. The request session and
// pairing read these fields and never name a dialect.
//
// Adding a dialect = one file in proto/dialects/ defining its `const Dialect` + one line in
// registry.cc's table (+ for a new connector its enumerator and its names row, both in
// proto/connectors.h; + the simulator's side, node/sim/dialects/). The per-dialect leg
// facts are in proto/REQUEST_LEGS.md; the wire facts in docs/design/wire-formats.md.
//
// Pure data and pure functions: no I/O (pre-steps that need I/O are run by the router,
// router/routing/pre_step.h, from the `pre_step` value).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>

#include "proto/base/status.h"
#include "proto/discovery_message.h"
#include "proto/json_splice.h"

namespace pdr::proto {

struct LegInstance;  // proto/request_legs.h
struct LegOptions;
struct LegPlan;
using RandomSource = std::function<uint64_t()>;

// What a dialect's build() gets: the chosen pair, the prefill's DP rank (validated against its
// dp_size), the options and the randomness.
struct DialectInput {
  const LegInstance& prefill;
  const LegInstance& decode;
  std::optional<uint32_t> prefill_rank;
  const LegOptions& options;
  const RandomSource& random;
};

// Which failed decodes may be resent, as they are, to another decode while the prefill's KV
// stays where it is (router/proxy/retry_rules.h); every other retryable failure starts a whole
// new pair.
enum class DecodeAloneRetry : uint8_t {
  kNever,        // the request id or the transfer names the decode (MoRIIO, P2P-NCCL) or the
                 // prefill pushes to it (Mooncake, SGLang, NIXL push)
  kIfNeverSent,  // only when the decode never got the request (connect failure): NIXL
};

// Work the router does before building the legs, once a pair is chosen.
enum class PreStep : uint8_t {
  kNone,
  // Mooncake: GET /query on the prefill's bootstrap server (DP rank -> engine_id); the answer
  // fills LegInstance::mooncake_engine_id and the prefill's DP rank count.
  kPrefillEngineQuery,
};

// The zmq_address an instance of the connector must register (discovery/config/instance_spec.cc).
enum class ZmqAddressForm : uint8_t {
  kNone,             // not used
  kMoriio,           // "host:IP,handshake:PORT,notify:PORT"
  kHostPort,         // "host:port"
  kPrefillHostPort,  // "host:port", required of prefills only (a decode's is checked if given)
};

struct Dialect {
  std::string_view name;  // "nixl", "moriio-read", ... (logs, tests)
  Connector connector = Connector::kUnknown;
  // The instances' transfer mode this dialect serves; kNone: the connector has no modes and the
  // instances' mode is ignored for pairing.
  TransferMode transfer_mode = TransferMode::kNone;

  // ---- order of the legs ----
  // true: prefill and decode are sent at once, the prefill's answer is read and dropped (MoRIIO
  // WRITE, Mooncake, SGLang, NIXL push).
  // false: the prefill's complete answer comes first, then the decode is sent.
  bool concurrent = false;
  // Serial dialects whose decode is completed from the prefill's answer (finish_decode).
  bool decode_needs_prefill_params = false;

  // ---- failures ----
  DecodeAloneRetry decode_alone_retry = DecodeAloneRetry::kNever;

  // ---- before the legs ----
  PreStep pre_step = PreStep::kNone;

  // ---- instance fields the connector needs (discovery/config/instance_spec.cc) ----
  ZmqAddressForm zmq_address = ZmqAddressForm::kNone;
  // A prefill that names no bootstrap_port gets connectors.mooncake_bootstrap_port.
  bool prefill_bootstrap_port_default = false;
  // A prefill must name its engine_id (NodeEndpoint::engine_id): the decode leg carries it.
  bool prefill_needs_engine_id = false;

  // ---- callbacks ----
  // Checks what the pair must satisfy (kRejected otherwise), sets the plan's ids and edits both
  // bodies, each of which starts as the client's body. Required.
  Status (*build)(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill,
                  JsonObjectBody* decode) = nullptr;
  // Completes the decode body from the prefill answer's kv_transfer_params (`params_raw`: its
  // raw bytes, `params`: parsed; non-empty object; `plan`: the pair's, with its hosts).
  // kMissingKey when a needed key is absent; kRejected when the answer aims the decode at a host
  // that is not the prefill (the answer is untrusted: any admitted node may be a prefill).
  // An error leaves *decode unchanged (it is the leg's own body, edited in place).
  // Set exactly when decode_needs_prefill_params.
  Status (*finish_decode)(const LegPlan& plan, std::string_view params_raw, const JsonObjectBody& params,
                          const JsonLimits& limits, JsonObjectBody* decode) = nullptr;
  // The no-KV fallback: what the decode body becomes when the prefill exported no KV (its answer
  // had no kv_transfer_params, e.g. EOS on the first token). nullptr: the prefill failed.
  void (*without_kv)(JsonObjectBody* decode) = nullptr;

  // ---- multi-turn (router/routing/multi_turn.h) ----
  // The decode's final answer carries kv_transfer_params that let the next turn's prefill
  // start from the KV the decode keeps (proto/multi_turn.h), so a conversation_id pins the
  // next turn to that decode (NIXL).
  bool multi_turn_reuse = false;

  // ---- endpoints ----
  // Empty: the pair serves vLLM's tokens-in POST /inference/v1/generate (proto/generate_request.h)
  // through P/D like completions. Else why it cannot, for the client's 501.
  std::string_view tokens_in_unsupported;
  // Empty: the pair serves Anthropic's POST /v1/messages (proto/anthropic_messages.h) through P/D
  // like chat completions. Else why it cannot, for the client's 501.
  std::string_view messages_unsupported;
};

// The dialect instances of `connector` with `transfer_mode` speak, or nullptr (unknown connector,
// a MoRIIO instance with no mode). For connectors without modes the mode is ignored.
const Dialect* dialect_for(Connector connector, TransferMode transfer_mode);

// Every dialect in the table, in table order.
std::span<const Dialect* const> all_dialects();
// `d`'s position in all_dialects() (per-dialect metrics index by it); all_dialects().size() when
// `d` is null or not in the table.
size_t dialect_index(const Dialect* d);

// The first dialect of `connector` (its instance-field rules are the connector's), or nullptr.
const Dialect* any_dialect_of(Connector connector);

// The transfer mode that tells instances of `connector` apart for pairing: `transfer_mode` when
// the connector's dialects differ by mode (MoRIIO), else kNone. Two instances pair when they
// have the same connector and class mode and dialect_for() knows them.
TransferMode pairing_mode(Connector connector, TransferMode transfer_mode);

}  // namespace pdr::proto
