// Exact cache-aware matching for text prompts through tokenisation by a node
// (policies.cache_aware.tokenize: node; off by default because it costs one HTTP hop per request).
//
// A text prompt (`/v1/completions` with a string `prompt`) or chat messages cannot be matched on
// the KV events' block index without their token ids (vLLM's KV events carry token ids only).
// With this on, before pairing, the session asks ONE node for them with vLLM's POST /tokenize:
// `{"model", "prompt"}` or `{"model", "messages"}` (plus the chat fields that change the
// template's output when the client sent them: tools, add_generation_prompt,
// continue_final_message, chat_template, chat_template_kwargs, add_special_tokens), answered
// `{"count", "max_model_len", "tokens": [...]}`. The ids are then matched exactly
// (cache_routing.h, match_token_ids).
//
// Which node sees the prompt: the up nodes serving the model that are labelled for it
// (`serves` naming kServesTokenize, e.g. a GPU-less render node: `serves: render,tokenize`);
// when none is up, the prefills this request could be paired with (up, serving the model, with a
// known connector and a compatible decode up), not ejected while another remains. So the text
// goes only to a node the operator chose for tokenisation or to one that may serve the request
// anyway, never to any other node of the fleet (a `connector: none` node is never paired). Among
// them the least loaded (outstanding / dp_size); the call counts in that node's outstanding
// while it runs, as a leg does.
//
// Bounds: policies.cache_aware.tokenize_timeout_ms is the whole call, from start to the last byte
// of the answer (connect, first byte and each read are bounded by it too); the answer is held
// only up to tokenize_max_answer_bytes and, as it arrives, within limits.max_buffered_bytes with
// every request body and buffered answer (pdrouter_buffered_bytes), given back when the call
// ends. Every outcome is counted (pdrouter_cache_tokenize_total{result}); on any failure the
// lookup keeps the prefix tree's answer, so routing never waits longer than tokenize_timeout_ms
// and never fails a request.
//
// Worker thread only: the call runs on the worker's loop (NodeCalls), `done` is called there,
// never inside start_tokenize. Cancelling the returned call (the client went away) suppresses
// `done` and gives back what the call held.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "proto/json_splice.h"
#include "router/routing/node_calls.h"
#include "router/routing/routing_shared.h"
#include "router/routing/routing_worker.h"

namespace pdr::router::routing {

// pdrouter_cache_tokenize_total's `result` label values, in CacheTokenizeCounters order.
enum class TokenizeResult : uint8_t {
  kMatched,    // tokenized, and some node holds the prompt's first block: exact match used
  kNoMatch,    // tokenized, no node holds its first block: the prefix tree's answer kept
  kNoNode,     // no up node serves the model
  kTimeout,    // the call took longer than tokenize_timeout_ms
  kFailed,     // connection failed or lost, or a non-200 answer
  kTooLarge,   // answer above tokenize_max_answer_bytes
  kBadAnswer,  // not JSON, or no integer array `tokens`
  kCancelled,  // the client went away during the call
  kMemoryBudget,  // the answer would take limits.max_buffered_bytes over its budget
};
inline constexpr size_t kTokenizeResultCount = 9;
// The `serves` label value (pairing.h, serves_capability) of the nodes that tokenize text prompts for it.
inline constexpr std::string_view kServesTokenize = "tokenize";
std::string_view to_string(TokenizeResult result);

// True when the request's prompt can be tokenized by a node: tokenize_by_node is on, the KV
// events index exists, and the body has a string `prompt` or an array `messages`.
bool wants_tokenize(const proto::JsonObjectBody& body, const config::Topology& topology,
                    const RoutingShared& shared);

// `ok`: `tokens` holds the prompt's ids (1..kMaxTokenizedIds); else `why_not` says why not (never
// kMatched / kNoMatch / kNoNode / kCancelled: the caller decides those).
using TokenizeDone = std::function<void(bool ok, TokenizeResult why_not, std::vector<uint32_t>&& tokens)>;

// Starts the call; null when no eligible node is up (then `done` is never called: the caller
// counts kNoNode). `body` is read only during this call.
NodeCalls::CallPtr start_tokenize(RoutingWorker& worker, const proto::JsonObjectBody& body, std::string_view model,
                                  std::string_view authorization, TokenizeDone done);

inline constexpr size_t kMaxTokenizedIds = 1 << 20;

}  // namespace pdr::router::routing
