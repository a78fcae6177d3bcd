// vLLM's tokens-in endpoint, POST /inference/v1/generate, as pdrouter splits it into a prefill
// and a decode leg. The body is {request_id?, token_ids, features?, sampling_params{...}, model?,
// stream?, stream_options?, cache_salt?, priority?, kv_transfer_params?} (vLLM's GenerateRequest;
// the render endpoints answer exactly this shape, so a render answer plus sampling_params is a
// generate body). Two differences from the OpenAI endpoints matter for the legs:
//   - the token counts (max_tokens, min_tokens) live in sampling_params, not at the top level;
//   - vLLM's generate handler hands only sampling_params to the engine, and the engine's request
//     takes its KV parameters from sampling_params.extra_args.kv_transfer_params; the top-level
//     kv_transfer_params is accepted but not used there (llm-d documents the same). pdrouter
//     writes both places, the same bytes in each.
// The dialects (proto/dialects/) edit top-level fields as for completions. build_legs() lets them
// work on a view of each leg where the token counts of sampling_params sit at the top level
// (generate_leg_view), then puts their edits back where vLLM reads them (finish_generate_leg).
// The client's sampling_params is parsed once, by check_generate_request (GenerateView).
// Pure; no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proto/base/status.h"
#include "proto/json_splice.h"

namespace pdr::proto {

inline constexpr std::string_view kGeneratePath = "/inference/v1/generate";

// Most token ids a generate request may carry (a prompt longer than any served context).
inline constexpr size_t kMaxGenerateTokenIds = 1 << 20;

// The client's generate body as check_generate_request found it, indexed once for building the
// legs (admission and every build of the legs read it; nothing parses the client's
// sampling_params again). Borrows the checked body's document: valid while that body, or a copy
// of it, lives. Copyable and movable (the views stay on the document).
struct GenerateView {
  JsonObjectBody sampling_params;  // the client's sampling_params (an object), indexed
  JsonObjectBody extra_args;       // sampling_params.extra_args, indexed; empty when absent or null
  bool has_extra_args = false;     // extra_args is present and not null
  int64_t choices = 1;             // sampling_params.n (1 when absent or null)
};

// What pdrouter checks before any leg (every message names the field, OpenAI-style):
//   token_ids        required; a non-empty array of at most kMaxGenerateTokenIds integers in
//                    [0, 2^32)
//   sampling_params  required; an object; inside it max_tokens and min_tokens are integers or
//                    null (max_tokens >= 1; both at most kMaxTokenCount, request_checks.h), n an
//                    integer >= 1 or null, extra_args an object or
//                    null, extra_args.kv_transfer_params an object or null
//   model            a string or null; stream a boolean or null; kv_transfer_params an object or
//                    null
// Errors: kMissingKey, kWrongType, kOutOfRange, kInvalidValue, kTooLarge. On success *view holds
// what the legs are built from (see GenerateView); on failure its contents are unspecified.
Status check_generate_request(const JsonObjectBody& body, const JsonLimits& limits, GenerateView* view);
// The same when only the count of choices is wanted: *choices gets sampling_params.n (1 when
// absent or null).
Status check_generate_request(const JsonObjectBody& body, const JsonLimits& limits, int64_t* choices);

// The raw text of the prompt's token ids (the client's "token_ids" value), or empty.
std::string_view generate_token_ids(const JsonObjectBody& body);

// Sets `leg` (a copy of the client's checked body, `view` its check) to the view the dialects
// edit: top-level max_tokens and min_tokens become sampling_params' values (absent when
// sampling_params has none). Parses nothing.
void generate_leg_view(const GenerateView& view, JsonObjectBody* leg);

// After the dialect built the view: its max_tokens / min_tokens go into sampling_params (an
// absent one is removed there), the top-level ones are the client's again, and the top-level
// kv_transfer_params is mirrored into sampling_params.extra_args (as mirror_generate_kv_params
// does). Parses nothing; sampling_params is rendered once, and only when it changed.
void finish_generate_leg(const JsonObjectBody& client, const GenerateView& view, JsonObjectBody* leg);

// sampling_params.extra_args.kv_transfer_params := the top-level kv_transfer_params (removed from
// extra_args when the top level has none or null). Run after every later edit of the top-level
// params (the decode completed from the prefill's answer, the no-KV fallback, multi-turn).
Status mirror_generate_kv_params(const JsonLimits& limits, JsonObjectBody* leg);

}  // namespace pdr::proto
