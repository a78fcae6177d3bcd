// Cache-aware routing around one request's pairing (policies.prefill / decode: cache_aware).
//
// Before pairing, lookup_cache() says how much of the prompt each node holds:
//   - a prompt of token ids (`/v1/completions` with an integer array, `/inference/v1/generate`'s
//     token_ids) with kv_events on: exactly,
//     from the nodes' KV events (router/cache/block_index.h), in tokens (PrefixMatch::
//     cached_tokens(): CPU-tier blocks at a discount). A request whose model is an adapter the
//     events named (BlockIndex::knows_lora) matches only that adapter's blocks; any other model
//     matches the base model's blocks (and an adapter's, when it holds some);
//   - otherwise (text, chat messages, or no KV events): approximately, from the prefix tree of
//     where pdrouter routed earlier prompts (router/cache/prefix_tree.h), in bytes of the prompt's
//     JSON text as sent (for chat, the messages array: a conversation's next turn extends it);
//     with policies.cache_aware.tokenize: node, the session then asks a node for the text's token
//     ids (cache_tokenize.h) and match_token_ids() makes the answer exact.
// The cache_aware policy (router/policies/cache_aware.h) picks from that. After pairing,
// record_routing() teaches the prefix tree where this prompt went (prefill and decode both hold
// its KV afterwards) and counts whether the chosen nodes held part of it.
//
// Runs on HTTP workers; the index and the tree are thread-safe.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "proto/json_splice.h"
#include "router/policies/policy.h"
#include "router/routing/pairing.h"
#include "router/routing/cache_routing_counters.h"
#include "router/routing/routing_shared.h"

namespace pdr::router::routing {

struct CacheRouting {
  CacheHits hits;
  std::string_view tree_key;  // the prompt's text for the prefix tree (views the client body)
  // The request's first-block extra keys for the KV events index: its `cache_salt` (vLLM hashes
  // it into the first block, so a salted prompt reuses only blocks of the same salt); empty
  // without one. Multimodal inputs have identifiers the router does not know: their blocks never
  // match (router/cache/block_index.h).
  std::string first_block_extra;
};

// The raw JSON text of a request's prompt: "prompt" (/v1/completions), else "messages" (chat),
// else "token_ids" (/inference/v1/generate); empty when the body has none. Views `body`.
std::string_view request_prompt(const proto::JsonObjectBody& body);

// Empty when neither policy is cache_aware or the body has no prompt/messages/token_ids. `body` must
// outlive the result.
std::optional<CacheRouting> lookup_cache(const proto::JsonObjectBody& body, std::string_view model,
                                         const config::Topology& topology, const RoutingShared& shared);

// Text prompts tokenized by a node (cache_tokenize.h): when some node holds the first block of
// `tokens`, replaces routing->hits with the exact answer (source kv_events) and returns true; else
// leaves the prefix tree's answer as it was. routing->tree_key is kept either way.
bool match_token_ids(const std::vector<uint32_t>& tokens, std::string_view model, const RoutingShared& shared,
                     CacheRouting* routing);

// After a pair was chosen for a request with a lookup; counted in `counters`.
void record_routing(const CacheRouting& routing, const Pair& pair, RoutingShared& shared,
                    CacheRoutingCounters& counters);

// Between two registry snapshots (both sorted by key): every node of `before` that is gone from
// `after`, or came back with another epoch (a restart: its cache is empty), is forgotten by the
// prefix tree, so cache_aware does not prefer it for prompts it no longer holds.
void forget_departed_nodes(const std::vector<InstancePtr>& before, const std::vector<InstancePtr>& after,
                           cache::PrefixTree& tree);

}  // namespace pdr::router::routing
