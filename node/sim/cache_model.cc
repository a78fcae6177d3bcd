#include "node/sim/cache_model.h"

#include <chrono>

namespace pdr::node::sim {
namespace {

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

SimCacheModel::SimCacheModel(const SimCacheOptions& options,
                             std::unique_ptr<SimKvEventsPublisher> publisher)
    : options_(options), publisher_(std::move(publisher)) {
  options_.ranks = std::max<uint32_t>(1, options_.ranks);
  for (uint32_t r = 0; r < options_.ranks; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->cache = std::make_unique<SimPrefixCache>(options_.block_tokens, options_.capacity_blocks);
    ranks_.push_back(std::move(rank));
  }
}

SimCacheModel::~SimCacheModel() {
  if (publisher_) publisher_->stop();
}

PrefixCacheUpdate SimCacheModel::on_prompt(uint32_t rank, const std::vector<uint32_t>& tokens) {
  if (rank >= ranks_.size()) rank = 0;
  Rank& r = *ranks_[rank];
  std::lock_guard<std::mutex> lock(r.order);
  PrefixCacheUpdate update = r.cache->process(tokens);
  if (publisher_ && !update.changes.empty()) {
    publisher_->publish(rank, encode_sim_kv_batch(unix_seconds_now(), rank, options_.events,
                                                  options_.block_tokens, update.changes));
  }
  return update;
}

void SimCacheModel::publish(uint32_t rank, std::span<const PrefixCacheChange> changes) {
  if (!publisher_) return;
  if (rank >= ranks_.size()) rank = 0;
  std::lock_guard<std::mutex> lock(ranks_[rank]->order);
  publisher_->publish(rank, changes.empty()
                                ? encode_sim_kv_cleared_batch(unix_seconds_now(), rank, options_.events.encoding)
                                : encode_sim_kv_batch(unix_seconds_now(), rank, options_.events,
                                                      options_.block_tokens, changes));
}

void SimCacheModel::reset() {
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    std::lock_guard<std::mutex> lock(ranks_[r]->order);
    ranks_[r]->cache->clear();
    if (publisher_) {
      publisher_->publish(r, encode_sim_kv_cleared_batch(unix_seconds_now(), r, options_.events.encoding));
    }
  }
}

nlohmann::json SimCacheModel::stats_json() const {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& rank : ranks_) {
    const PrefixCacheStats s = rank->cache->stats();
    ranks.push_back({{"blocks", s.blocks},
                     {"queries", s.queries},
                     {"queried_tokens", s.queried_tokens},
                     {"hit_tokens", s.hit_tokens},
                     {"stored_blocks", s.stored_blocks},
                     {"evicted_blocks", s.evicted_blocks},
                     {"clears", s.clears}});
  }
  return nlohmann::json{
      {"block_tokens", options_.block_tokens},
      {"capacity_blocks", options_.capacity_blocks},
      {"encoding", options_.events.encoding == KvEventsEncoding::kMap ? "map" : "array"},
      {"kv_groups", [&] {
         nlohmann::json groups = nlohmann::json::array();
         for (const SimKvGroup& g : options_.events.groups) {
           groups.push_back({{"kind", g.kind}, {"window_tokens", g.window_tokens}});
         }
         return groups;
       }()},
      {"cpu_tier", options_.events.cpu_tier == SimCpuTier::kNone             ? "none"
                   : options_.events.cpu_tier == SimCpuTier::kSelfDescribing ? "self-describing"
                                                                             : "placeholder"},
      {"ranks", std::move(ranks)},
      {"kv_events", publisher_ ? publisher_->stats() : nlohmann::json(nullptr)}};
}

}  // namespace pdr::node::sim
