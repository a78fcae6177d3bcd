// Node-selection policies: given the candidate instances for one leg (prefill or decode) and a
// summary of the request, return which candidate to use. Policies are pure: no libuv, sockets,
// YAML or registry types. The router builds the candidate list from its registry snapshot (already
// filtered to healthy, compatible, non-draining instances) and owns all I/O.
//
// Threading: one Policy object is shared by every HTTP worker; pick() may run concurrently on any
// worker thread. All policy state is atomic with relaxed ordering (it only spreads load, it
// publishes no data), so pick() never locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/config/topology.h"

namespace pdr::router {

struct PromptTokens;  // prompt_tokens.h

// Which leg a policy picks for (predicted_latency predicts a different latency for each).
enum class PolicyLeg : uint8_t { kPrefill, kDecode };

// What pdrouter has put on a node (discovery/load_ledger.h), copied for policies whose
// needs_load() is true (predicted_latency.h); left zero for the others.
struct CandidateLoad {
  uint64_t queued_prefill_tokens = 0;  // uncached prompt tokens of prefill legs not yet answered
  uint32_t decode_sequences = 0;       // decode legs running
  uint64_t kv_tokens = 0;              // KV tokens those hold
  double prefill_tokens_per_second = 0;  // the node's measured estimate; 0: none yet
  double decode_step_seconds = 0;        // the node's measured estimate; 0: none yet
  // From the node's own /metrics while fresh (discovery/engine_load.h, load_signals): requests
  // running or waiting there that pdrouter did not send (another replica's, direct clients'),
  // and its KV cache usage 0..1 (negative: not known).
  uint32_t other_requests = 0;
  double kv_cache_usage = -1;
  // The first three are those of the DP rank the next leg will be pinned to, not the node's
  // totals (a node with dp_size > 1 whose ledger has per-rank figures).
  bool of_next_rank = false;
};

struct Candidate {
  // Stable identity of the instance: its HTTP address ("host:port"). Affinity hashes it, so it
  // must not change while the instance lives. Not owned: valid for the duration of pick().
  std::string_view key;
  // Requests pdrouter currently has in flight on this instance, summed over all workers.
  uint32_t outstanding = 0;
  // Relative capacity (e.g. dp_size). Load is compared as outstanding / weight; affinity gives a
  // node a share of keys proportional to its weight. round_robin ignores it. 0 is treated as 1.
  uint32_t weight = 1;
  // The ledger's figures (node totals, or its next DP rank's: CandidateLoad::of_next_rank); only
  // for a policy whose needs_load() is true.
  CandidateLoad load{};
};

// What the router knows of the nodes' caches for one request (cache_aware only): how much of the
// prompt each node holds, in `unit`s (tokens, from the nodes' KV events, or bytes of prompt text,
// from the prefix tree of earlier routing). Nodes not listed hold none of it.
struct CacheHits {
  enum class Source : uint8_t { kKvEvents, kPrefixTree };
  struct Node {
    std::string key;       // the instance's key
    uint32_t matched = 0;  // leading units of the prompt it holds
  };
  Source source = Source::kPrefixTree;
  uint32_t prompt_units = 0;
  std::vector<Node> nodes;

  // `key`'s matched units, 0 when not listed.
  uint32_t matched(std::string_view key) const;
};

// How a load-predicting policy chose one leg (GET /debug/route).
struct LegExplanation {
  struct Row {
    std::string key;
    uint32_t outstanding = 0;
    uint32_t weight = 1;
    CandidateLoad load;             // the ledger's figures as read (Candidate::load)
    uint64_t uncached_tokens = 0;   // of this prompt, on this node (what a decode would pull)
    double predicted_seconds = 0;   // TTFT (prefill) or time per output token (decode)
    double score = 0;               // what the choice minimised (prefill: TTFT + its fleet work)
    bool kv_full = false;           // decode: this request would exceed its KV capacity
  };
  bool filled = false;
  std::vector<Row> rows;
  size_t chosen = 0;
  // The chosen node is the session's or the conversation's (session affinity, multi-turn KV
  // reuse), not the policy's pick: the rows are still predicted, so the SLO check sees it.
  bool preferred = false;
  // The candidate holding the most of the prompt, when any holds some of it.
  std::optional<size_t> cache_best;
};
struct RouteExplanation {
  LegExplanation prefill, decode;
  // The prefill rate (tokens/s) the chosen prefill was predicted at: the decode side predicts a
  // prompt its node computes itself (serving alone) at it. 0: not predicted.
  double prefill_tokens_per_second = 0;
  // Set when the decode computes the prompt itself because the prefills are busy (conditional
  // disaggregation, prefill_busy_ms): its predicted TTFT, which the SLO check then reads.
  std::optional<double> decode_alone_seconds;
};

struct RequestSummary {
  uint64_t affinity_hash = 0;  // meaningful only when has_affinity
  bool has_affinity = false;
  // Owned by the request (it outlives every pick of it, retries included); null: unknown.
  const CacheHits* cache = nullptr;
  // The prompt's token count (predicted_latency); owned by the request; null: unknown (0 tokens).
  const PromptTokens* prompt = nullptr;
  // When set, a load-predicting policy writes how it chose here (owned by the request).
  RouteExplanation* explain = nullptr;
};

class Policy {
 public:
  virtual ~Policy() = default;

  // Returns an index into `candidates`, which must be non-empty (the caller answers 503 when no
  // instance qualifies). A single candidate always yields 0. Thread-safe; never blocks.
  virtual size_t pick(std::span<const Candidate> candidates, const RequestSummary& request) = 0;

  virtual config::PolicyName name() const = 0;

  // True when pick() reads Candidate::load: the pairing copies the ledger only then, so the
  // policies that do not read it pay nothing for it.
  virtual bool needs_load() const { return false; }
};

// Fair rotation: one shared counter, index = counter % size. A change in the candidate list only
// changes the modulus.
std::unique_ptr<Policy> make_round_robin_policy();
// Minimum outstanding / weight; ties rotate among the tied candidates.
std::unique_ptr<Policy> make_least_outstanding_policy();
// Two distinct candidates drawn uniformly (splitmix64 stream seeded from `seed`, deterministic
// for a single caller), the less loaded of the two wins; equal load keeps the first draw.
std::unique_ptr<Policy> make_power_of_two_policy(uint64_t seed);
// Weighted rendezvous (highest-random-weight) hashing of request.affinity_hash over candidate
// keys: the same key maps to the same instance regardless of list order, and adding or removing
// one instance moves only the keys that it gains or held. Requests without an affinity key fall
// back to least_outstanding. Affinity ignores load: a hot key stays on its node.
std::unique_ptr<Policy> make_affinity_policy();

// Cache affinity that yields to load (cache_aware.h's rule, its thresholds from `config`): the
// candidate holding the most of the prompt (request.cache) when the rule keeps it, else
// least_outstanding.
std::unique_ptr<Policy> make_cache_aware_policy(const config::Topology::Policies::CacheAware& config);

// Factory used with the topology's policies. `seed` feeds the policies that randomise
// (power_of_two); `config` the cache-aware and predicted-latency ones; `leg` the latter; the
// others ignore them.
std::unique_ptr<Policy> make_policy(config::PolicyName name, uint64_t seed,
                                    const config::Topology::Policies& config = {}, PolicyLeg leg = PolicyLeg::kPrefill);

// True when `a` carries strictly less load than `b`, i.e. a.outstanding / a.weight <
// b.outstanding / b.weight, computed exactly in integers.
inline bool less_loaded(const Candidate& a, const Candidate& b) {
  const uint64_t wa = a.weight == 0 ? 1 : a.weight;
  const uint64_t wb = b.weight == 0 ? 1 : b.weight;
  return uint64_t{a.outstanding} * wb < uint64_t{b.outstanding} * wa;
}

// ---- Affinity keys ---------------------------------------------------------------------------

// XXH64 (xxHash, 64-bit variant), bit-exact with the reference implementation, so any tool can
// reproduce a key's hash (`xxh64sum`). Chosen over FNV-1a for speed on 256-byte prompt prefixes
// (8 bytes per step, 4 lanes) and over wyhash for having no degenerate multiply-by-zero state.
// Not keyed: a client can pick colliding keys, which only concentrates its own requests.
uint64_t affinity_hash(std::string_view bytes, uint64_t seed = 0);

// What the router extracted from one request; empty views mean "absent". The JSON and header
// parsing happens elsewhere; these are raw bytes as received.
struct AffinityInputs {
  std::string_view header_value;     // value of the header named by policies.affinity_header
  std::string_view conversation_id;  // top-level "conversation_id" field
  std::string_view user;             // top-level "user" field
  std::string_view prompt;           // "prompt", or the chat messages' text, in request order
};

// Each returns has_affinity = false when its source is empty.
RequestSummary affinity_from_header(std::string_view header_value);
RequestSummary affinity_from_session(std::string_view conversation_id, std::string_view user);
// Hashes the first min(prefix_bytes, prompt.size()) bytes, so requests sharing a long common
// prefix (system prompt, few-shot examples) land where that prefix's KV cache is warm.
RequestSummary affinity_from_prompt_prefix(std::string_view prompt, uint32_t prefix_bytes);

// The first present source wins: header, then conversation_id, then user, then prompt prefix
// (skipped when prefix_bytes is 0). Sources are not domain-separated: header "x" and user "x"
// hash alike, which is harmless because one deployment uses one source in practice.
RequestSummary summarize_affinity(const AffinityInputs& inputs, uint32_t prefix_bytes);

}  // namespace pdr::router
