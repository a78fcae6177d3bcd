#include "router/routing/cache_routing.h"

#include <algorithm>
#include <vector>

#include "proto/kv_events.h"
#include "proto/token_ids.h"
#include "router/cache/block_index.h"
#include "router/cache/prefix_tree.h"

namespace pdr::router::routing {

namespace {

// Longest token prompt matched exactly; longer prompts still match on their first blocks.
constexpr size_t kMaxPromptTokens = 1 << 20;

// The policies that read the cache hits: cache_aware, and predicted_latency (a hit shortens the
// predicted prefill).
bool cache_aware(const config::Topology& t) {
  using config::PolicyName;
  auto reads_hits = [](PolicyName p) { return p == PolicyName::kCacheAware || p == PolicyName::kPredictedLatency; };
  return reads_hits(t.policies.prefill) || reads_hits(t.policies.decode);
}

// Exact hits of `tokens` from the KV events; false when no node holds their first block.
bool match_blocks(const std::vector<uint32_t>& tokens, std::string_view model, std::string_view first_block_extra,
                  const cache::BlockIndex& index, CacheHits* hits) {
  // The engine chains a LoRA adapter's blocks from the adapter's name, and vLLM serves an adapter
  // under that name: a request's model is the base model or an adapter, which only the events
  // tell apart. The adapter's blocks first (none hang off a base model's name); a name the events
  // gave an adapter then matches nothing else, since the base model's blocks are not its own.
  std::vector<cache::PrefixMatch> matches;
  if (!model.empty()) matches = index.longest_prefix(tokens, model, first_block_extra);
  if (matches.empty() && (model.empty() || !index.knows_lora(model))) {
    matches = index.longest_prefix(tokens, std::nullopt, first_block_extra);
  }
  if (matches.empty()) return false;
  CacheHits exact;
  exact.source = CacheHits::Source::kKvEvents;
  exact.prompt_units = static_cast<uint32_t>(tokens.size());
  for (const cache::PrefixMatch& m : matches) {
    exact.nodes.push_back({m.node, static_cast<uint32_t>(std::min<uint64_t>(m.cached_tokens(), tokens.size()))});
  }
  *hits = std::move(exact);
  return true;
}

// Exact hits from the KV events; false when the prompt is not token ids or no node holds its first
// block (the prefix tree may still know where it went).
bool lookup_blocks(std::string_view prompt, std::string_view model, std::string_view first_block_extra,
                   const cache::BlockIndex& index, CacheHits* hits) {
  thread_local std::vector<uint32_t> tokens;
  if (!proto::parse_token_id_array(prompt, kMaxPromptTokens, &tokens)) return false;
  return match_blocks(tokens, model, first_block_extra, index, hits);
}

// vLLM's cache_salt, as the first block's extra keys; empty without one (or one that is not a
// string: vLLM refuses that request itself).
std::string first_block_extra_of(const proto::JsonObjectBody& body) {
  std::optional<std::string> salt;
  if (!body.get_string("cache_salt", &salt).is_ok() || !salt || salt->empty()) return {};
  return proto::kv_extra_keys_for_cache_salt(*salt);
}

// Token ids in the first `bytes` of a JSON array of them: the commas before that point (the
// number cut at `bytes`, if any, does not count).
uint32_t token_ids_within(std::string_view prompt, size_t bytes) {
  const std::string_view head = prompt.substr(0, std::min(bytes, prompt.size()));
  return static_cast<uint32_t>(std::count(head.begin(), head.end(), ','));
}

// The KV events say what a node holds once it computed it. A prompt routed a moment ago is not
// there yet (its prefill may wait behind others), so its conversation's or document's next
// request would find it nowhere and could go to another node, which computes and caches the
// prefix a second time. Where pdrouter sent earlier prompts (the prefix tree) is known at once:
// each node's hit is the larger of the two, in tokens.
void merge_routed(std::string_view prompt, const cache::PrefixTree& tree, std::string_view tree_key,
                  CacheHits* hits) {
  for (const cache::PrefixTree::Match& m : tree.match(tree_key)) {
    const uint32_t tokens = token_ids_within(prompt, m.matched_bytes);
    if (tokens == 0) continue;
    auto it = std::find_if(hits->nodes.begin(), hits->nodes.end(),
                           [&](const CacheHits::Node& n) { return n.key == m.tenant; });
    if (it == hits->nodes.end()) {
      hits->nodes.push_back({m.tenant, tokens});
    } else {
      it->matched = std::max(it->matched, tokens);
    }
  }
}

size_t source_index(CacheHits::Source source) { return source == CacheHits::Source::kKvEvents ? 0 : 1; }

}  // namespace

std::string_view request_prompt(const proto::JsonObjectBody& body) {
  for (std::string_view key : {"prompt", "messages", "token_ids"}) {
    if (auto raw = body.get_raw(key)) return *raw;
  }
  return {};
}

std::optional<CacheRouting> lookup_cache(const proto::JsonObjectBody& body, std::string_view model,
                                         const config::Topology& topology, const RoutingShared& shared) {
  if (!cache_aware(topology)) return std::nullopt;
  std::string_view prompt = request_prompt(body);
  if (prompt.empty() || prompt == "null") return std::nullopt;
  CacheRouting routing;
  routing.tree_key = prompt.substr(0, topology.policies.cache_aware.prefix_tree_prompt_bytes);
  routing.first_block_extra = first_block_extra_of(body);
  if (shared.block_index != nullptr &&
      lookup_blocks(prompt, model, routing.first_block_extra, *shared.block_index, &routing.hits)) {
    if (shared.prefix_tree != nullptr) merge_routed(prompt, *shared.prefix_tree, routing.tree_key, &routing.hits);
    return routing;
  }
  routing.hits.source = CacheHits::Source::kPrefixTree;
  routing.hits.prompt_units = static_cast<uint32_t>(routing.tree_key.size());
  if (shared.prefix_tree != nullptr) {
    for (cache::PrefixTree::Match& m : shared.prefix_tree->match(routing.tree_key)) {
      routing.hits.nodes.push_back({std::move(m.tenant), static_cast<uint32_t>(m.matched_bytes)});
    }
  }
  return routing;
}

bool match_token_ids(const std::vector<uint32_t>& tokens, std::string_view model, const RoutingShared& shared,
                     CacheRouting* routing) {
  return shared.block_index != nullptr && !tokens.empty() &&
         match_blocks(tokens, model, routing->first_block_extra, *shared.block_index, &routing->hits);
}

void record_routing(const CacheRouting& routing, const Pair& pair, RoutingShared& shared,
                    CacheRoutingCounters& counters) {
  const auto now = cache::PrefixTree::Clock::now();
  const size_t source = source_index(routing.hits.source);
  for (const InstancePtr* node : {&pair.prefill, &pair.decode}) {
    const size_t leg = node == &pair.prefill ? 0 : 1;
    const uint32_t matched = routing.hits.matched((*node)->key);
    auto& c = counters;
    c.requests[leg][source].fetch_add(1, std::memory_order_relaxed);
    if (matched > 0) c.hits[leg][source].fetch_add(1, std::memory_order_relaxed);
    c.matched_units[leg][source].fetch_add(matched, std::memory_order_relaxed);
    c.prompt_units[leg][source].fetch_add(routing.hits.prompt_units, std::memory_order_relaxed);
    if (shared.prefix_tree != nullptr && !routing.tree_key.empty()) {
      shared.prefix_tree->insert(routing.tree_key, (*node)->key, now);
    }
  }
}

void forget_departed_nodes(const std::vector<InstancePtr>& before, const std::vector<InstancePtr>& after,
                           cache::PrefixTree& tree) {
  auto a = after.begin();
  for (const InstancePtr& old : before) {
    while (a != after.end() && (*a)->key < old->key) ++a;
    const bool same = a != after.end() && (*a)->key == old->key && (*a)->epoch == old->epoch &&
                      (*a)->restarts == old->restarts;
    if (!same) tree.remove_tenant(old->key);
  }
}

}  // namespace pdr::router::routing
