// SimCacheModel: what `pdnode sim` knows of its prefix caches: one SimPrefixCache per DP rank
// (each rank is an engine of its own, as in vLLM) and, when configured, the KV events publisher
// that tells routers about them (kv_events_publisher.h), in the chosen encoding.
//
// The server calls on_prompt() once per generation request with the prompt's token ids
// (prompt_tokens.h): the rank's cache is looked up and stored (prefix_cache.h) and the
// changes go out as one batch. reset() empties every rank's cache (vLLM's POST
// /reset_prefix_cache) and publishes AllBlocksCleared on each.
//
// Threads: every method may be called from any worker. A rank's cache changes and their batches
// are serialised under one lock per rank, so batches go out in the order the cache changed.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/kv_events_encode.h"
#include "node/sim/kv_events_publisher.h"
#include "node/sim/prefix_cache.h"

namespace pdr::node::sim {

struct SimCacheOptions {
  uint32_t ranks = 1;
  uint32_t block_tokens = 16;
  uint32_t capacity_blocks = 2048;  // per rank
  // The events' encoding, KV cache groups and CPU tier (kv_events_encode.h).
  SimKvEventsShape events;
};

class SimCacheModel {
 public:
  // `publisher`: started already, or null (no events).
  SimCacheModel(const SimCacheOptions& options, std::unique_ptr<SimKvEventsPublisher> publisher);
  ~SimCacheModel();

  // A rank beyond the configured ones uses rank 0's cache (the server validated the header).
  PrefixCacheUpdate on_prompt(uint32_t rank, const std::vector<uint32_t>& tokens);
  void reset();
  // Publishes changes of a cache kept elsewhere (the engine's, node/sim/engine/driver.h,
  // which then replaces this model's): one batch, or AllBlocksCleared when `changes` is empty.
  void publish(uint32_t rank, std::span<const PrefixCacheChange> changes);
  SimKvEventsPublisher* publisher() { return publisher_.get(); }
  // {"block_tokens":N,"capacity_blocks":N,"ranks":[PrefixCacheStats as JSON, ...],
  //  "kv_events": publisher stats or null}
  nlohmann::json stats_json() const;

 private:
  SimCacheOptions options_;
  struct Rank {
    std::mutex order;  // held across a cache change and queuing its batch
    std::unique_ptr<SimPrefixCache> cache;
  };
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<SimKvEventsPublisher> publisher_;
};

}  // namespace pdr::node::sim
