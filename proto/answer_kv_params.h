// kv_transfer_params in the answers pdrouter relays to clients. A decode's kv_transfer_params are
// node-internal: with NIXL's bidirectional_kv_xfer (vLLM PR #32553) they name the decode's host,
// its KV side-channel port, its engine id and the block ids it keeps for the conversation, and
// other connectors put their own addresses and ids there. pdrouter reads them where it needs
// them (router/routing/multi_turn.h) and sets them to null in every P/D answer a client gets: a
// vLLM without P/D answers "kv_transfer_params": null, so clients see the same shape.
//
// Where vLLM puts them (and where they are nulled): the top level of a JSON answer (completions,
// chat, /inference/v1/generate, /v1/responses, /v1/messages) and of a stream chunk (the last one, vLLM PR
// #40186), and the "response" object of a Responses stream event (response.completed). A
// non-null kv_transfer_params anywhere else is not one vLLM writes and is left alone.
//
// Cost: the bytes are searched for the key's text (memmem, `"kv_transfer_params"` with its
// quotes: inside a JSON string the quotes would be escaped, so only a real key or a string value
// of exactly that text matches); only a JSON text where the key's value is not null is parsed and
// rendered again (the answer or the one event carrying them). vLLM writes the key in this plain
// spelling; a spelling with \u escapes is not looked for.
//
// Pure; no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdr::proto {

// Bytes of the text searched for: "kv_transfer_params" with its quotes.
inline constexpr size_t kKvParamsKeyBytes = 20;

// True when `text` may hold a kv_transfer_params member whose value is not null: the key's text
// followed by ':' (or by anything but ',', '}', ']' and whitespace: a string value of that text
// is followed by one of those) and a value other than `null`, or cut off at the end of `text`.
bool carries_kv_params(std::string_view text);

enum class KvParamsEdit : uint8_t {
  kNone,      // nothing to remove: relay the bytes as they are
  kRedacted,  // relay *out instead
  kRefused,   // params that cannot be removed (not valid JSON; in the part of an event split
              // across writes): relay none of it
};

// A whole JSON answer.
KvParamsEdit redact_kv_params_json(std::string_view answer, std::string* out);

// Server-sent events about to be relayed: whole events (each ended by its blank line; the last
// one may lack it when the stream ended there), except that with `starts_mid_event` the bytes
// before the first blank line are the rest of an event whose start was already relayed: params
// there are kRefused. An event carrying params has its data lines joined (as SSE readers do),
// edited and written back as the same number of "data: " lines; its other lines and its blank
// line stay as they were, and so do the events around it.
KvParamsEdit redact_kv_params_events(std::string_view events, bool starts_mid_event, std::string* out);

}  // namespace pdr::proto
