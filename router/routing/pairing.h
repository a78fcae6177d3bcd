// Choosing the (prefill, decode) pair for one request from a registry snapshot.
//
// An instance is routable when its state is up (not draining, not expired); one whose connector
// is unknown is never paired. A prefill and a decode
// are compatible when they speak the same known connector and, for MoRIIO, the same transfer
// mode (READ with READ, WRITE with WRITE): the two legs of one request must follow one dialect
// (docs/design/wire-formats.md, rule 4). An instance that declared a model serves only requests
// naming that model; one that declared none serves any.
//
// Selection: the prefill policy picks among routable prefills that have at least one compatible
// routable decode; the decode policy then picks among the decodes compatible with that prefill.
// Instances named in the exclusion lists (already tried by this request) are skipped, and so are
// ejected ones (ejection.h) while a candidate of their role that is not ejected remains: with all
// of them ejected, trying one beats refusing the request. Policies see each instance's live
// outstanding count and its dp_size as weight; a policy whose needs_load() is true also its load
// ledger's node totals and rate estimates (Candidate::load), read only for it.
//
// Cost: the snapshot's RoutableIndex (discovery/instance.h) groups routable instances by role and
// compatibility class, so a successful choice visits only the members of the classes that have
// both a prefill and a decode (serving the query's model), never the whole registry. Only when
// no pair exists is the registry scanned, to say why in the 503.
//
// Pure apart from atomic counters (the policies', and next_dp_rank's per instance): no I/O, safe
// on any worker thread.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/instance.h"
#include "proto/base/status.h"
#include "router/policies/policy.h"

namespace pdr::router::routing {

using InstancePtr = std::shared_ptr<const discovery::Instance>;

bool compatible(const discovery::Instance& prefill, const discovery::Instance& decode);
bool routable(const discovery::Instance& instance);
bool serves_model(const discovery::Instance& instance, std::string_view model);
// The node label that lists what a node serves besides P/D legs (one-node endpoints:
// router/proxy/one_node_relay.h; the node /tokenize call: cache_tokenize.h).
inline constexpr std::string_view kServesLabel = "serves";
// True when `labels` has `serves` naming `capability` in its comma-separated list.
bool serves_capability(const proto::Labels& labels, std::string_view capability);
// The least loaded of `nodes` (pdrouter's in-flight count / dp_size, as least_outstanding reads
// it), ties going to the first from `start` on (callers pass a random start so ties rotate);
// null when `nodes` is empty. The one-node endpoints and cache_aware's tokenize call pick with it.
const InstancePtr* least_loaded_node(const std::vector<const InstancePtr*>& nodes, size_t start);

struct PairQuery {
  std::string_view model;                           // the client's "model"; empty: any
  std::span<const std::string> excluded_prefills;   // instance keys
  std::span<const std::string> excluded_decodes;
  RequestSummary summary;                           // affinity key, if any
  discovery::Clock::time_point now{};               // for ejections; the epoch: ignore them
  size_t* visited = nullptr;  // when set, incremented per instance examined (tests: cost bound)
  // A decode to use when it is usable (routable, not excluded, not ejected, serving the model,
  // with a compatible prefill): the one holding a conversation's KV (multi_turn). Empty, or not
  // usable: the decode policy picks.
  std::string_view preferred_decode;
  // A prefill to use when it is among the prefills the choice would pick from (routable, not
  // excluded, not ejected, serving the model, compatible with the decode side): a session's bound
  // prefill (session_affinity.h). Empty, or not there: the prefill policy picks.
  std::string_view preferred_prefill;
  // At least 0: the preferred prefill is kept only while a prefill policy that predicts (its
  // explanation filled: predicted_latency) predicts it a TTFT within this many seconds of the
  // least it predicts for a candidate; beyond that the policy's own pick is used, and
  // Pair::prefill_spilled says so. Negative: the preferred prefill is kept whatever is predicted.
  double preferred_prefill_margin_seconds = -1;
};

struct Pair {
  InstancePtr prefill;
  InstancePtr decode;
  // The query's preferred prefill was usable but predicted too slow by its margin (above).
  bool prefill_spilled = false;
};

// OK with both set, or kNotFound with a message for the client's 503 saying what is missing
// ("no prefill instance is up", "no decode instance compatible with any prefill: ...").
Status choose_pair(const discovery::RegistrySnapshot& snapshot, const PairQuery& query,
                   Policy& prefill_policy, Policy& decode_policy, Pair* out);

// A decode for an already chosen prefill (decode retry). OK or kNotFound.
Status choose_decode(const discovery::RegistrySnapshot& snapshot, const discovery::Instance& prefill,
                     const PairQuery& query, Policy& decode_policy, InstancePtr* out);

// The DP rank to pin a leg to `instance` to (X-data-parallel-rank, remote_dp_rank), or nullopt
// when its dp_size is 1: each instance's ranks in turn, from a counter of its own. This is what
// docs/design/wire-formats.md rule 10's counter over (instance, rank) slots guarantees when, as here,
// policies pick the instance: every rank of every instance gets its share. One counter shared by
// all instances and both legs aliased: with P and D both at dp_size 2 each request took two
// steps of it, so the prefill always got rank 0.
std::optional<uint32_t> next_dp_rank(const discovery::Instance& instance);
// The same with the rank count learned elsewhere (a Mooncake prefill's bootstrap /query).
std::optional<uint32_t> next_dp_rank(const discovery::Instance& instance, uint32_t dp_size);

// OK when at least one compatible routable pair exists (GET /ready), else kNotFound with why.
Status any_pair(const discovery::RegistrySnapshot& snapshot);

}  // namespace pdr::router::routing
