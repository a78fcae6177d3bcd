#include "router/cache/block_index.h"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <shared_mutex>
#include <unordered_set>

#include "proto/base/keyed_hash.h"
#include "router/policies/policy.h"

namespace pdr::router::cache {

namespace {

RouterHash chain_seed(std::optional<std::string_view> lora_name) {
  return lora_name && !lora_name->empty() ? affinity_hash(*lora_name) : 0;
}

// The seed of a block with extra keys: they are hashed into the chain before its tokens.
RouterHash with_extra(RouterHash parent, std::string_view extra) {
  return extra.empty() ? parent : affinity_hash(extra, parent);
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// vLLM's KVCacheSpecKind values whose groups hold the whole prefix (vllm/v1/kv_cache_interface.py).
bool full_attention_kind(std::string_view kind) {
  return kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention";
}

// GPU (no medium: older vLLM published its GPU pool only), node-local CPU, or neither.
enum class EventTier { kGpu, kCpu, kOther };
EventTier tier_of(const proto::KvEvent& e) {
  if (e.locality && !iequals(*e.locality, "LOCAL")) return EventTier::kOther;
  if (e.medium.empty() || iequals(e.medium, "GPU")) return EventTier::kGpu;
  if (iequals(e.medium, "CPU")) return EventTier::kCpu;
  return EventTier::kOther;
}

uint32_t group_of(const proto::KvEvent& e) { return static_cast<uint32_t>(e.group_idx.value_or(0)); }

constexpr size_t kMaxGroupKinds = 64;

// XXH64 of the block's token ids as little-endian u32s, chained through the seed.
RouterHash block_hash(std::span<const uint32_t> block, RouterHash parent) {
  thread_local std::string bytes;
  bytes.resize(4 * block.size());
  for (size_t i = 0; i < block.size(); ++i) {
    const uint32_t t = block[i];
    bytes[4 * i] = static_cast<char>(t & 0xFF);
    bytes[4 * i + 1] = static_cast<char>((t >> 8) & 0xFF);
    bytes[4 * i + 2] = static_cast<char>((t >> 16) & 0xFF);
    bytes[4 * i + 3] = static_cast<char>((t >> 24) & 0xFF);
  }
  return affinity_hash(bytes, parent);
}

}  // namespace

std::vector<RouterHash> chain_hashes(std::span<const uint32_t> tokens, uint32_t block_size,
                                     std::optional<std::string_view> lora_name, std::string_view first_block_extra) {
  std::vector<RouterHash> out;
  if (block_size == 0) return out;
  RouterHash parent = chain_seed(lora_name);
  out.reserve(tokens.size() / block_size);
  for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    parent = block_hash(tokens.subspan(start, block_size), with_extra(parent, start == 0 ? first_block_extra : ""));
    out.push_back(parent);
  }
  return out;
}

BlockIndex::BlockIndex(size_t max_entries) : max_entries_(max_entries == 0 ? 1 : max_entries) {
  process_hash_key();  // drawn now, at start-up, rather than on the first event
}

BlockIndex::~BlockIndex() = default;

BlockIndex::Rank& BlockIndex::rank_for(std::string_view node, uint32_t dp_rank) {
  const auto key = std::make_pair(std::string(node), dp_rank);
  if (auto it = ranks_.find(key); it != ranks_.end()) return it->second;
  return ranks_.emplace(key, Rank{}).first->second;
}

BlockIndex::Rank* BlockIndex::find_rank(std::string_view node, uint32_t dp_rank) {
  auto it = ranks_.find(std::make_pair(std::string(node), dp_rank));
  return it == ranks_.end() ? nullptr : &it->second;
}

std::optional<BlockIndex::HolderId> BlockIndex::holder_for(Rank& rank, std::string_view node, uint32_t dp_rank,
                                                           uint32_t group, Tier tier, bool create) {
  bool group_held = false;
  size_t groups = 0;  // distinct groups the rank holds
  for (size_t i = 0; i < rank.holders.size(); ++i) {
    const Holder& h = *holders_[rank.holders[i]];
    if (h.group == group) {
      if (h.tier == tier) return rank.holders[i];
      group_held = true;
    }
    const bool earlier = std::any_of(rank.holders.begin(), rank.holders.begin() + static_cast<ptrdiff_t>(i),
                                     [&](HolderId id) { return holders_[id]->group == h.group; });
    if (!earlier) ++groups;
  }
  if (!create || (!group_held && groups >= kMaxGroupsPerRank)) return std::nullopt;
  auto h = std::make_unique<Holder>();
  h->node = std::string(node);
  h->dp_rank = dp_rank;
  h->group = group;
  h->tier = tier;
  h->rank = &rank;
  HolderId id;
  if (!free_ids_.empty()) {  // a node that came and went leaves its slot to the next one
    id = free_ids_.back();
    free_ids_.pop_back();
    holders_[id] = std::move(h);
  } else {
    id = static_cast<HolderId>(holders_.size());
    holders_.push_back(std::move(h));
  }
  rank.holders.push_back(id);
  return id;
}

bool BlockIndex::prefix_group(Rank& rank, const proto::KvEvent& event) {
  const uint32_t group = group_of(event);
  auto known = std::find_if(rank.group_kinds.begin(), rank.group_kinds.end(),
                            [&](const auto& g) { return g.first == group; });
  if (event.kv_cache_spec_kind) {
    const bool prefix = full_attention_kind(*event.kv_cache_spec_kind);
    if (known != rank.group_kinds.end()) {
      known->second = prefix;
    } else if (rank.group_kinds.size() < kMaxGroupKinds) {
      rank.group_kinds.emplace_back(group, prefix);
    }
    return prefix;
  }
  // No kind in this event (older vLLM, or an offload tier's placeholder): what the group said
  // before, else a group without a sliding window holds the prefix.
  if (known != rank.group_kinds.end()) return known->second;
  return !(event.kv_cache_spec_sliding_window && *event.kv_cache_spec_sliding_window > 0);
}

void BlockIndex::remember_lora(const std::string& name) {
  if (lora_names_.size() < kMaxLoraNames || lora_names_.contains(name)) lora_names_.insert(name);
}

bool BlockIndex::knows_lora(std::string_view name) const {
  std::shared_lock lock(mu_);
  return lora_names_.find(name) != lora_names_.end();
}

const BlockIndex::Block* BlockIndex::twin(const Holder& h, proto::EngineHash engine) const {
  if (h.rank == nullptr) return nullptr;
  for (const HolderId other : h.rank->holders) {
    const Holder& o = *holders_[other];
    if (&o == &h || o.group != h.group) continue;
    if (const Block* found = o.blocks.find(engine)) return found;
  }
  return nullptr;
}

void BlockIndex::link(HolderId id, RouterHash hash) {
  Holdings& list = holders_of_.try_emplace(hash).first->second;
  if (list.first.count == 0) {
    list.first = {id, 1};
    return;
  }
  if (list.first.holder == id) {
    ++list.first.count;
    return;
  }
  const uint32_t n = list.more ? list.more[0].holder : 0;
  for (uint32_t i = 1; i <= n; ++i) {
    if (list.more[i].holder == id) {
      ++list.more[i].count;
      return;
    }
  }
  const uint32_t capacity = list.more ? list.more[0].count : 0;
  if (n == capacity) {  // grows 1, 3, 7, ...: one allocation per doubling
    const uint32_t grown = 2 * capacity + 1;
    auto bigger = std::make_unique<Holding[]>(grown + 1);
    for (uint32_t i = 1; i <= n; ++i) bigger[i] = list.more[i];
    bigger[0] = {n, grown};
    list.more = std::move(bigger);
  }
  list.more[n + 1] = {id, 1};
  list.more[0].holder = n + 1;
}

void BlockIndex::unlink(HolderId id, RouterHash hash) {
  auto* found = holders_of_.find(hash);
  if (found == nullptr) return;
  Holdings& list = found->second;
  const uint32_t n = list.more ? list.more[0].holder : 0;
  // The holding to decrement: the inline one, or one of the others (more[i]).
  Holding* holding = nullptr;
  uint32_t at = 0;
  if (list.first.count > 0 && list.first.holder == id) {
    holding = &list.first;
  } else {
    for (uint32_t i = 1; i <= n; ++i) {
      if (list.more[i].holder == id) {
        holding = &list.more[i];
        at = i;
        break;
      }
    }
  }
  if (holding == nullptr || --holding->count > 0) return;
  // The last of this holder's copies went: the last of the others fills its place.
  if (n > 0) {
    if (at != n) *holding = list.more[n];
    list.more[0].holder = n - 1;
    if (n == 1) list.more.reset();
  } else {
    holders_of_.erase(hash);
  }
}

void BlockIndex::push_newest(Block* block) {
  Entry& e = block->second;
  e.older = newest_;
  e.newer = nullptr;
  if (newest_ != nullptr) {
    newest_->second.newer = block;
  } else {
    oldest_ = block;
  }
  newest_ = block;
}

void BlockIndex::unlink_order(Block* block) {
  Entry& e = block->second;
  (e.older != nullptr ? e.older->second.newer : oldest_) = e.newer;
  (e.newer != nullptr ? e.newer->second.older : newest_) = e.older;
  e.older = e.newer = nullptr;
}

void BlockIndex::forget(HolderId id, Block& block) {
  unlink(id, block.second.hash);
  unlink_order(&block);
  --entries_;
}

void BlockIndex::evict_oldest(Work* work) {
  Block* victim = oldest_;
  const HolderId id = victim->second.holder;
  Holder& h = *holders_[id];
  const proto::EngineHash engine = victim->first;
  forget(id, *victim);
  h.blocks.erase(engine);
  ++h.evicted;
  ++totals_.blocks_evicted;
  if (work->blocks > 0) --work->blocks;
}

bool BlockIndex::stored_event(Rank*& rank_of_batch, std::string_view node, uint32_t dp_rank,
                              const proto::KvEvent& event, Cursor* cursor, Work* work) {
  if (!cursor->started) {
    cursor->started = true;
    const uint64_t n = event.block_hashes.size();
    if (rank_of_batch == nullptr) rank_of_batch = &rank_for(node, dp_rank);
    Rank& rank = *rank_of_batch;
    if (event.lora_name && !event.lora_name->empty()) remember_lora(*event.lora_name);
    const EventTier tier = tier_of(event);
    if (tier == EventTier::kOther || !prefix_group(rank, event)) {
      rank.ignored += n;
      totals_.blocks_ignored += n;
      return true;
    }
    cursor->target = holder_for(rank, node, dp_rank, group_of(event), tier == EventTier::kGpu ? Tier::kGpu : Tier::kCpu,
                                /*create=*/true);
    if (!cursor->target) {  // one group too many
      rank.skipped += n;
      totals_.blocks_skipped += n;
      return true;
    }
  }
  if (!cursor->target) return true;
  return store(*cursor->target, event, cursor, work);
}

bool BlockIndex::store(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work) {
  Holder& h = *holders_[id];
  const size_t n = event.block_hashes.size();
  const bool tokenless = event.block_size == 0 || event.token_ids.empty();
  if (cursor->block == 0) {
    const auto skip = [&] {
      h.skipped += n;
      totals_.blocks_skipped += n;
      return true;
    };
    // An adapter named only by id: no request names it so. Extra keys not one per block: which
    // block has which is unknown. Tokens not block_size per block: the content is unknown.
    if ((event.lora_id && !event.lora_name) || (event.has_extra_keys() && event.extra_keys.size() != n) ||
        (!tokenless && event.token_ids.size() != n * event.block_size)) {
      return skip();
    }
    if (!tokenless) {
      cursor->parent =
          chain_seed(event.lora_name ? std::optional<std::string_view>(*event.lora_name) : std::nullopt);
      if (event.parent_block_hash) {
        const Block* parent = h.blocks.find(*event.parent_block_hash);
        if (parent == nullptr) parent = twin(h, *event.parent_block_hash);
        if (parent == nullptr) return skip();
        cursor->parent = parent->second.hash;
      }
      h.block_size = event.block_size;
    }
  }
  const std::span<const uint32_t> tokens(event.token_ids);
  for (size_t& i = cursor->block; i < n; ++i) {
    if (work->spent()) return false;
    const proto::EngineHash engine = event.block_hashes[i];
    RouterHash hash = 0;
    if (tokenless) {
      // Named by the engine hash alone: the router hash of the same block in another tier.
      const Block* other = twin(h, engine);
      if (other == nullptr) {
        ++h.skipped;
        ++totals_.blocks_skipped;
        --work->blocks;
        continue;
      }
      hash = other->second.hash;
      if (h.block_size == 0) h.block_size = holders_[other->second.holder]->block_size;
    } else {
      const std::string_view extra = event.has_extra_keys() ? std::string_view(event.extra_keys[i]) : "";
      hash = block_hash(tokens.subspan(i * event.block_size, event.block_size), with_extra(cursor->parent, extra));
    }
    // Growing a map relinks a whole shard: that counts against the slice too. A slice that has
    // done nothing yet may grow any one shard (so every batch progresses), and then ends.
    if (const size_t cost = h.blocks.growth_cost(engine) + holders_of_.growth_cost(hash); cost > 0) {
      if (work->fresh() && cost > work->rehash) {
        work->rehash = 0;
        work->blocks = 1;  // this store, then the slice ends
      } else if (cost > work->rehash) {
        return false;
      } else {
        work->rehash -= cost;
      }
    }
    cursor->parent = hash;
    auto [block, inserted] = h.blocks.try_emplace(engine, Entry{hash, nullptr, nullptr, id});
    if (!inserted) {
      // Stored again (e.g. after a replay): it becomes the most recent; the same content is
      // expected, but a different one replaces the old link. A CPU tier counts its copies.
      if (block->second.hash != hash) {
        unlink(id, block->second.hash);
        link(id, hash);
        block->second.hash = hash;
      }
      if (h.tier == Tier::kCpu && block->second.copies < UINT16_MAX) ++block->second.copies;
      unlink_order(block);
    } else {
      link(id, hash);
      ++entries_;
    }
    push_newest(block);
    ++h.stored;
    ++totals_.blocks_stored;
    --work->blocks;
    if (!tokenless) work->tokens -= std::min<size_t>(work->tokens, event.block_size);
    // The budget holds at every lock release: one store over it evicts the oldest entry (never
    // the one just stored, the newest, since the budget is at least 1).
    if (entries_ > max_entries_) evict_oldest(work);
  }
  return true;
}

bool BlockIndex::removed_event(Rank* rank, std::string_view node, uint32_t dp_rank, const proto::KvEvent& event,
                               Cursor* cursor, Work* work) {
  if (!cursor->started) {
    cursor->started = true;
    const EventTier tier = tier_of(event);
    // Another tier or a group that was never indexed has nothing here to remove.
    if (rank != nullptr && tier != EventTier::kOther) {
      cursor->target = holder_for(*rank, node, dp_rank, group_of(event),
                                  tier == EventTier::kGpu ? Tier::kGpu : Tier::kCpu, /*create=*/false);
    }
  }
  if (!cursor->target) return true;
  return remove(*cursor->target, event, cursor, work);
}

bool BlockIndex::remove(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work) {
  Holder& h = *holders_[id];
  for (size_t& i = cursor->block; i < event.block_hashes.size(); ++i) {
    if (work->spent()) return false;
    --work->blocks;
    const proto::EngineHash engine = event.block_hashes[i];
    Block* block = h.blocks.find(engine);
    if (block == nullptr) continue;
    if (block->second.copies > 1) {  // a CPU tier still holds another announced copy
      --block->second.copies;
      continue;
    }
    forget(id, *block);
    h.blocks.erase(engine);
    ++h.removed;
    ++totals_.blocks_removed;
  }
  return true;
}

bool BlockIndex::clear(HolderId id, Work* work) {
  Holder& h = *holders_[id];
  const size_t gone = h.blocks.drain(work->blocks, [&](Block& block) { forget(id, block); });
  work->blocks -= gone;
  h.removed += gone;
  totals_.blocks_removed += gone;
  return h.blocks.empty();
}

bool BlockIndex::cleared_event(Rank* rank, Cursor* cursor, Work* work) {
  // A prefix cache reset: every group and tier of the rank (the event names none).
  if (rank == nullptr) return true;
  for (size_t& i = cursor->holder; i < rank->holders.size(); ++i) {
    if (!clear(rank->holders[i], work)) return false;
  }
  return true;
}

void BlockIndex::apply(std::string_view node, uint32_t dp_rank, const proto::KvEventBatch& batch) {
  std::lock_guard writer(writer_mu_);
  Cursor cursor;
  // The (node, DP rank), found once, made by its first store: the writer lock keeps drops (the
  // only erasers of ranks_) out until the batch is done, so the pointer stays valid.
  Rank* rank = nullptr;
  bool looked = false;
  // An empty batch changes nothing: no holder is made for it, the lock is not taken.
  while (cursor.event < batch.events.size()) {
    // Each pass is one exclusive hold; the writer lock keeps other writers (and drops) out between
    // them, so the holders and the cursor stay valid.
    {
      std::unique_lock lock(mu_);
      if (!looked) {
        rank = find_rank(node, dp_rank);
        looked = true;
      }
      Work work;
      while (cursor.event < batch.events.size() && !work.spent()) {
        const proto::KvEvent& event = batch.events[cursor.event];
        bool done = true;
        switch (event.kind) {
          case proto::KvEventKind::kBlockStored:
            done = stored_event(rank, node, dp_rank, event, &cursor, &work);
            break;
          case proto::KvEventKind::kBlockRemoved:
            done = removed_event(rank, node, dp_rank, event, &cursor, &work);
            break;
          case proto::KvEventKind::kAllBlocksCleared: done = cleared_event(rank, &cursor, &work); break;
        }
        if (!done) break;  // the slice's work is spent (or a map's growth waits for the next slice)
        const size_t next = cursor.event + 1;
        cursor = Cursor{};
        cursor.event = next;
      }
    }
    after_slice();
  }
}

void BlockIndex::drop_node(std::string_view node) { drop_holders(node, std::nullopt); }

void BlockIndex::drop_rank(std::string_view node, uint32_t dp_rank) { drop_holders(node, dp_rank); }

void BlockIndex::drop_holders(std::string_view node, std::optional<uint32_t> dp_rank) {
  std::lock_guard writer(writer_mu_);
  std::vector<HolderId> ids;
  {
    // Gone for lookups at once. The writer lock keeps batches out until its entries are erased;
    // a later batch naming the node gets new holders.
    std::unique_lock lock(mu_);
    for (auto it = ranks_.begin(); it != ranks_.end();) {
      if (it->first.first != node || (dp_rank && it->first.second != *dp_rank)) {
        ++it;
        continue;
      }
      for (const HolderId id : it->second.holders) {
        holders_[id]->dropping = true;
        holders_[id]->rank = nullptr;
        ids.push_back(id);
      }
      it = ranks_.erase(it);
    }
  }
  if (ids.empty()) return;
  after_slice();
  for (const HolderId id : ids) {
    std::unique_ptr<Holder> gone;
    while (!gone) {
      {
        std::unique_lock lock(mu_);
        Work work;
        if (clear(id, &work)) {
          gone = std::move(holders_[id]);
          free_ids_.push_back(id);
        }
      }
      after_slice();
    }
    // Its (now empty) maps' bucket arrays are freed here, with no lock held.
  }
}

std::vector<PrefixMatch> BlockIndex::longest_prefix(std::span<const uint32_t> tokens,
                                                    std::optional<std::string_view> lora_name,
                                                    std::string_view first_block_extra) const {
  std::shared_lock lock(mu_);
  // Block sizes in use (normally one for the whole fleet).
  std::vector<uint32_t> sizes;
  for (const auto& h : holders_) {
    if (h && !h->dropping && h->block_size != 0 && std::find(sizes.begin(), sizes.end(), h->block_size) == sizes.end()) {
      sizes.push_back(h->block_size);
    }
  }
  // Per (rank, group): leading blocks held in any tier, and on the GPU. A block held in both
  // tiers extends each count once.
  struct Tally {
    uint32_t any = 0, gpu = 0, block_size = 0;
  };
  struct CacheKey {
    const Rank* rank;
    uint32_t group;
    bool operator==(const CacheKey&) const = default;
  };
  struct CacheKeyHash {
    size_t operator()(const CacheKey& k) const {
      return std::hash<const void*>{}(k.rank) ^ (size_t{k.group} * 0x9E3779B97F4A7C15ull);
    }
  };
  std::unordered_map<CacheKey, Tally, CacheKeyHash> tallies;
  for (const uint32_t size : sizes) {
    RouterHash parent = chain_seed(lora_name);
    for (size_t start = 0, i = 0; start + size <= tokens.size(); start += size, ++i) {
      parent = block_hash(tokens.subspan(start, size), with_extra(parent, i == 0 ? first_block_extra : ""));
      const auto* found = holders_of_.find(parent);
      if (found == nullptr) break;
      bool any = false;
      const auto extend = [&](const Holding& holding) {
        const Holder& h = *holders_[holding.holder];
        if (h.dropping || h.block_size != size) return;
        Tally& t = tallies[CacheKey{h.rank, h.group}];
        t.block_size = size;
        if (t.any == i) {
          t.any = static_cast<uint32_t>(i + 1);
          any = true;
        }
        if (h.tier == Tier::kGpu && t.gpu == i) {
          t.gpu = static_cast<uint32_t>(i + 1);
          any = true;
        }
      };
      const Holdings& list = found->second;
      extend(list.first);
      for (uint32_t k = 1, n = list.more ? list.more[0].holder : 0; k <= n; ++k) extend(list.more[k]);
      if (!any) break;
    }
  }
  // Per rank: as far as every one of its indexed groups holds (vLLM needs a hit in each); per
  // node: its best rank.
  std::vector<PrefixMatch> out;
  std::unordered_set<const Rank*> done;
  for (const auto& tally : tallies) {
    const Rank* rank = tally.first.rank;
    if (!done.insert(rank).second) continue;
    std::optional<PrefixMatch> best;  // the rank's most limiting group
    const std::string* node = nullptr;
    for (size_t i = 0; i < rank->holders.size(); ++i) {
      const Holder& h = *holders_[rank->holders[i]];
      node = &h.node;
      if (h.block_size == 0) continue;  // holds no tokens of its own: not a group of its yet
      const bool earlier = std::any_of(rank->holders.begin(), rank->holders.begin() + static_cast<ptrdiff_t>(i),
                                       [&](HolderId id) {
                                         return holders_[id]->group == h.group && holders_[id]->block_size != 0;
                                       });
      if (earlier) continue;
      const auto t = tallies.find(CacheKey{rank, h.group});
      PrefixMatch m;
      if (t != tallies.end()) m = PrefixMatch{{}, t->second.any, t->second.gpu, t->second.block_size};
      if (m.block_size == 0) m.block_size = h.block_size;
      if (!best || m.cached_tokens() < best->cached_tokens()) best = m;
    }
    if (!best || best->matched_blocks == 0 || node == nullptr) continue;
    best->node = *node;
    auto same = std::find_if(out.begin(), out.end(), [&](const PrefixMatch& m) { return m.node == *node; });
    if (same == out.end()) {
      out.push_back(std::move(*best));
    } else if (best->cached_tokens() > same->cached_tokens()) {
      *same = std::move(*best);
    }
  }
  std::sort(out.begin(), out.end(), [](const PrefixMatch& a, const PrefixMatch& b) {
    const uint64_t ta = a.cached_tokens(), tb = b.cached_tokens();
    if (ta != tb) return ta > tb;
    if (a.matched_blocks != b.matched_blocks) return a.matched_blocks > b.matched_blocks;
    return a.node < b.node;
  });
  return out;
}

BlockIndex::Stats BlockIndex::stats() const {
  std::shared_lock lock(mu_);
  Stats s = totals_;
  s.entries = entries_;
  return s;
}

BlockIndex::Stats BlockIndex::node_stats(std::string_view node) const {
  std::shared_lock lock(mu_);
  Stats s;
  for (auto it = ranks_.lower_bound(std::make_pair(std::string(node), uint32_t{0}));
       it != ranks_.end() && it->first.first == node; ++it) {
    s.blocks_skipped += it->second.skipped;
    s.blocks_ignored += it->second.ignored;
    for (const HolderId id : it->second.holders) {
      const Holder& h = *holders_[id];
      s.entries += h.blocks.size();
      s.blocks_stored += h.stored;
      s.blocks_removed += h.removed;
      s.blocks_evicted += h.evicted;
      s.blocks_skipped += h.skipped;
    }
  }
  return s;
}

size_t BlockIndex::holder_slots() const {
  std::shared_lock lock(mu_);
  return holders_.size();
}

}  // namespace pdr::router::cache
