#include "router/cache/block_index.h"

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include "base/keyed_hash.h"
#include "router/policies/policy.h"

namespace pdr::router::cache {

namespace {

RouterHash chain_seed(std::optional<std::string_view> lora_name) {
  return lora_name && !lora_name->empty() ? affinity_hash(*lora_name) : 0;
}

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
                                     std::optional<std::string_view> lora_name) {
  std::vector<RouterHash> out;
  if (block_size == 0) return out;
  RouterHash parent = chain_seed(lora_name);
  out.reserve(tokens.size() / block_size);
  for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
    parent = block_hash(tokens.subspan(start, block_size), parent);
    out.push_back(parent);
  }
  return out;
}

BlockIndex::BlockIndex(size_t max_entries) : max_entries_(max_entries == 0 ? 1 : max_entries) {
  process_hash_key();  // drawn now, at start-up, rather than on the first event
}

BlockIndex::~BlockIndex() = default;

BlockIndex::HolderId BlockIndex::holder_for(std::string_view node, uint32_t dp_rank) {
  const auto key = std::make_pair(std::string(node), dp_rank);
  if (auto it = holder_ids_.find(key); it != holder_ids_.end()) return it->second;
  auto h = std::make_unique<Holder>();
  h->node = std::string(node);
  h->dp_rank = dp_rank;
  HolderId id;
  if (!free_ids_.empty()) {  // a node that came and went leaves its slot to the next one
    id = free_ids_.back();
    free_ids_.pop_back();
    holders_[id] = std::move(h);
  } else {
    id = static_cast<HolderId>(holders_.size());
    holders_.push_back(std::move(h));
  }
  holder_ids_.emplace(key, id);
  return id;
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

bool BlockIndex::store(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work) {
  Holder& h = *holders_[id];
  const size_t n = event.block_hashes.size();
  if (cursor->block == 0) {
    const auto skip = [&] {
      h.skipped += n;
      totals_.blocks_skipped += n;
      return true;
    };
    if (event.has_extra_keys || event.block_size == 0 || event.token_ids.size() != n * event.block_size) {
      return skip();
    }
    cursor->parent =
        chain_seed(event.lora_name ? std::optional<std::string_view>(*event.lora_name) : std::nullopt);
    if (event.parent_block_hash) {
      const Block* parent = h.blocks.find(*event.parent_block_hash);
      if (parent == nullptr) return skip();
      cursor->parent = parent->second.hash;
    }
    h.block_size = event.block_size;
  }
  const std::span<const uint32_t> tokens(event.token_ids);
  for (size_t& i = cursor->block; i < n; ++i) {
    if (work->spent()) return false;
    const proto::EngineHash engine = event.block_hashes[i];
    const RouterHash hash = block_hash(tokens.subspan(i * event.block_size, event.block_size), cursor->parent);
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
      // expected, but a different one replaces the old link.
      if (block->second.hash != hash) {
        unlink(id, block->second.hash);
        link(id, hash);
        block->second.hash = hash;
      }
      unlink_order(block);
    } else {
      link(id, hash);
      ++entries_;
    }
    push_newest(block);
    ++h.stored;
    ++totals_.blocks_stored;
    --work->blocks;
    work->tokens -= std::min<size_t>(work->tokens, event.block_size);
    // The budget holds at every lock release: one store over it evicts the oldest entry (never
    // the one just stored, the newest, since the budget is at least 1).
    if (entries_ > max_entries_) evict_oldest(work);
  }
  return true;
}

bool BlockIndex::remove(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work) {
  Holder& h = *holders_[id];
  for (size_t& i = cursor->block; i < event.block_hashes.size(); ++i) {
    if (work->spent()) return false;
    --work->blocks;
    const proto::EngineHash engine = event.block_hashes[i];
    Block* block = h.blocks.find(engine);
    if (block == nullptr) continue;
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

void BlockIndex::apply(std::string_view node, uint32_t dp_rank, const proto::KvEventBatch& batch) {
  std::lock_guard writer(writer_mu_);
  std::optional<HolderId> id;
  Cursor cursor;
  // Each pass is one exclusive hold; the writer lock keeps other writers (and drops) out between
  // them, so the holder and the cursor stay valid.
  do {
    {
      std::unique_lock lock(mu_);
      if (!id) id = holder_for(node, dp_rank);
      Work work;
      while (cursor.event < batch.events.size() && !work.spent()) {
        const proto::KvEvent& event = batch.events[cursor.event];
        bool done = true;
        switch (event.kind) {
          case proto::KvEventKind::kBlockStored: done = store(*id, event, &cursor, &work); break;
          case proto::KvEventKind::kBlockRemoved: done = remove(*id, event, &cursor, &work); break;
          case proto::KvEventKind::kAllBlocksCleared: done = clear(*id, &work); break;
        }
        if (!done) break;  // the slice's work is spent (or a map's growth waits for the next slice)
        cursor = {cursor.event + 1, 0, 0};
      }
    }
    after_slice();
  } while (cursor.event < batch.events.size());
}

void BlockIndex::drop_node(std::string_view node) { drop_holders(node, std::nullopt); }

void BlockIndex::drop_rank(std::string_view node, uint32_t dp_rank) { drop_holders(node, dp_rank); }

void BlockIndex::drop_holders(std::string_view node, std::optional<uint32_t> dp_rank) {
  std::lock_guard writer(writer_mu_);
  std::vector<HolderId> ids;
  {
    // Gone for lookups at once. The writer lock keeps batches out until its entries are erased;
    // a later batch naming the node gets a new holder.
    std::unique_lock lock(mu_);
    for (auto it = holder_ids_.begin(); it != holder_ids_.end();) {
      if (it->first.first != node || (dp_rank && it->first.second != *dp_rank)) {
        ++it;
        continue;
      }
      holders_[it->second]->dropping = true;
      ids.push_back(it->second);
      it = holder_ids_.erase(it);
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
                                                    std::optional<std::string_view> lora_name) const {
  std::shared_lock lock(mu_);
  // Block sizes in use (normally one for the whole fleet).
  std::vector<uint32_t> sizes;
  for (const auto& h : holders_) {
    if (h && !h->dropping && h->block_size != 0 && std::find(sizes.begin(), sizes.end(), h->block_size) == sizes.end()) {
      sizes.push_back(h->block_size);
    }
  }
  std::vector<PrefixMatch> out;
  for (const uint32_t size : sizes) {
    // matched[holder] = leading blocks held; a holder that misses block i is out from then on.
    std::unordered_map<HolderId, uint32_t> matched;
    RouterHash parent = chain_seed(lora_name);
    for (size_t start = 0, i = 0; start + size <= tokens.size(); start += size, ++i) {
      parent = block_hash(tokens.subspan(start, size), parent);
      const auto* found = holders_of_.find(parent);
      if (found == nullptr) break;
      bool any = false;
      const auto extend = [&](const Holding& holding) {
        const Holder& h = *holders_[holding.holder];
        if (h.dropping || h.block_size != size) return;
        uint32_t& m = matched[holding.holder];
        if (m == i) {
          m = static_cast<uint32_t>(i + 1);
          any = true;
        }
      };
      const Holdings& list = found->second;
      extend(list.first);
      for (uint32_t k = 1, n = list.more ? list.more[0].holder : 0; k <= n; ++k) extend(list.more[k]);
      if (!any) break;
    }
    for (const auto& [holder, blocks] : matched) {
      if (blocks == 0) continue;
      const std::string& node = holders_[holder]->node;
      auto same = std::find_if(out.begin(), out.end(), [&](const PrefixMatch& m) { return m.node == node; });
      if (same == out.end()) {
        out.push_back({node, blocks, size});
      } else if (uint64_t{blocks} * size > uint64_t{same->matched_blocks} * same->block_size) {
        *same = {node, blocks, size};
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const PrefixMatch& a, const PrefixMatch& b) {
    const uint64_t ta = uint64_t{a.matched_blocks} * a.block_size, tb = uint64_t{b.matched_blocks} * b.block_size;
    return ta != tb ? ta > tb : a.node < b.node;
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
  for (const auto& h : holders_) {
    if (!h || h->dropping || h->node != node) continue;
    s.entries += h->blocks.size();
    s.blocks_stored += h->stored;
    s.blocks_removed += h->removed;
    s.blocks_evicted += h->evicted;
    s.blocks_skipped += h->skipped;
  }
  return s;
}

size_t BlockIndex::holder_slots() const {
  std::shared_lock lock(mu_);
  return holders_.size();
}

}  // namespace pdr::router::cache
