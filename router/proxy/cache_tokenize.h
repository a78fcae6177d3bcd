// Exact cache-aware matching for text prompts through tokenisation by a node
// (policies.cache_aware.tokenize: node; off by default because it costs one HTTP hop per request).
//
// A text prompt (`/v1/completions` with a string `prompt`) or chat messages cannot be matched on
// the KV events' block index without their token ids (API_FACTS.md 2.5). With this on, before
// pairing, the session asks ONE up node serving the request's model (prefill or decode, the least
// loaded) for them with vLLM's POST /tokenize: `{"model", "prompt"}` or `{"model", "messages"}`
// (plus the chat fields that change the template's output when the client sent them: tools,
// add_generation_prompt, continue_final_message, chat_template, chat_template_kwargs,
// add_special_tokens), answered `{"count", "max_model_len", "tokens": [...]}`. The ids are then
// matched exactly (cache_routing.h, match_token_ids). Every outcome is counted
// (pdrouter_cache_tokenize_total{result}); on any failure the lookup keeps the prefix tree's
// answer, so routing never waits longer than policies.cache_aware.tokenize_timeout_ms (connect,
// first byte and each read of the answer) and never fails a request.
//
// Worker thread only: the call runs on the worker's loop (UpstreamPort), `done` is called there,
// never inside start_tokenize. Cancelling the returned call (the client went away) suppresses
// `done`.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "proto/json_splice.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// pdrouter_cache_tokenize_total's `result` label values, in ProxyCounters::cache_tokenize order.
enum class TokenizeResult : uint8_t {
  kMatched,    // tokenized, and some node holds the prompt's first block: exact match used
  kNoMatch,    // tokenized, no node holds its first block: the prefix tree's answer kept
  kNoNode,     // no up node serves the model
  kTimeout,    // connect, first byte or a read of the answer took too long
  kFailed,     // connection failed or lost, or a non-200 answer
  kTooLarge,   // answer above tokenize_max_answer_bytes
  kBadAnswer,  // not JSON, or no integer array `tokens`
  kCancelled,  // the client went away during the call
};
inline constexpr size_t kTokenizeResultCount = 8;
std::string_view to_string(TokenizeResult result);

// True when the request's prompt can be tokenized by a node: tokenize_by_node is on, the KV
// events index exists, and the body has a string `prompt` or an array `messages`.
bool wants_tokenize(const proto::JsonObjectBody& body, const config::Topology& topology,
                    const ProxyShared& shared);

// `ok`: `tokens` holds the prompt's ids (1..kMaxTokenizedIds); else `why_not` says why not (never
// kMatched / kNoMatch / kNoNode / kCancelled: the caller decides those).
using TokenizeDone = std::function<void(bool ok, TokenizeResult why_not, std::vector<uint32_t>&& tokens)>;

// Starts the call; null when no node serves `model` (then `done` is never called: the caller
// counts kNoNode). `body` is read only during this call.
UpstreamPort::CallPtr start_tokenize(WorkerContext& worker, const proto::JsonObjectBody& body, std::string_view model,
                                     std::string_view authorization, TokenizeDone done);

inline constexpr size_t kMaxTokenizedIds = 1 << 20;

}  // namespace pdr::router::proxy
