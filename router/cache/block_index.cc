#include "router/cache/block_index.h"

#include <algorithm>
#include <mutex>

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

BlockIndex::BlockIndex(size_t max_entries) : max_entries_(max_entries == 0 ? 1 : max_entries) {}

BlockIndex::HolderId BlockIndex::holder_for(std::string_view node, uint32_t dp_rank) {
  const auto key = std::make_pair(std::string(node), dp_rank);
  if (auto it = holder_ids_.find(key); it != holder_ids_.end()) return it->second;
  Holder h;
  h.node = std::string(node);
  h.dp_rank = dp_rank;
  HolderId id;
  if (!free_ids_.empty()) {  // a node that came and went leaves its slot to the next one
    id = free_ids_.back();
    free_ids_.pop_back();
    holders_[id].emplace(std::move(h));
  } else {
    id = static_cast<HolderId>(holders_.size());
    holders_.emplace_back(std::move(h));
  }
  holder_ids_.emplace(key, id);
  return id;
}

void BlockIndex::link(HolderId id, RouterHash hash) {
  std::vector<Holding>& list = holders_of_[hash];
  for (Holding& h : list) {
    if (h.holder == id) {
      ++h.count;
      return;
    }
  }
  list.push_back({id, 1});
}

void BlockIndex::unlink(HolderId id, RouterHash hash) {
  auto it = holders_of_.find(hash);
  if (it == holders_of_.end()) return;
  std::vector<Holding>& list = it->second;
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].holder != id) continue;
    if (--list[i].count == 0) {
      list[i] = list.back();
      list.pop_back();
    }
    break;
  }
  if (list.empty()) holders_of_.erase(it);
}

void BlockIndex::store(HolderId id, const proto::KvEvent& event) {
  Holder& h = *holders_[id];
  const size_t n = event.block_hashes.size();
  const auto skip = [&] {
    h.skipped += n;
    totals_.blocks_skipped += n;
  };
  if (event.has_extra_keys || event.block_size == 0 || event.token_ids.size() != n * event.block_size) {
    skip();
    return;
  }
  RouterHash parent = chain_seed(event.lora_name ? std::optional<std::string_view>(*event.lora_name) : std::nullopt);
  if (event.parent_block_hash) {
    auto it = h.blocks.find(*event.parent_block_hash);
    if (it == h.blocks.end()) {
      skip();
      return;
    }
    parent = it->second.hash;
  }
  h.block_size = event.block_size;
  const std::span<const uint32_t> tokens(event.token_ids);
  for (size_t i = 0; i < n; ++i) {
    const RouterHash hash = block_hash(tokens.subspan(i * event.block_size, event.block_size), parent);
    parent = hash;
    const uint64_t generation = next_generation_++;
    auto [it, inserted] = h.blocks.try_emplace(event.block_hashes[i], Holder::Entry{hash, generation});
    if (!inserted) {
      // Stored again (e.g. after a replay): it becomes the most recent; the same content is
      // expected, but a different one replaces the old link.
      if (it->second.hash != hash) {
        unlink(id, it->second.hash);
        link(id, hash);
      }
      it->second = {hash, generation};
    } else {
      link(id, hash);
      ++entries_;
    }
    order_.push_back({id, event.block_hashes[i], generation});
    ++h.stored;
    ++totals_.blocks_stored;
  }
}

void BlockIndex::remove(HolderId id, proto::EngineHash engine) {
  Holder& h = *holders_[id];
  auto it = h.blocks.find(engine);
  if (it == h.blocks.end()) return;
  unlink(id, it->second.hash);
  h.blocks.erase(it);
  --entries_;
  ++h.removed;
  ++totals_.blocks_removed;
}

void BlockIndex::compact_order() {
  std::deque<Stored> live;
  for (const Stored& s : order_) {
    if (!holders_[s.holder]) continue;
    const auto& blocks = holders_[s.holder]->blocks;
    auto it = blocks.find(s.engine);
    if (it != blocks.end() && it->second.generation == s.generation) live.push_back(s);
  }
  order_.swap(live);
}

void BlockIndex::enforce_budget() {
  while (entries_ > max_entries_ && !order_.empty()) {
    const Stored s = order_.front();
    order_.pop_front();
    if (!holders_[s.holder]) continue;
    Holder& h = *holders_[s.holder];
    auto it = h.blocks.find(s.engine);
    if (it == h.blocks.end() || it->second.generation != s.generation) continue;  // stale record
    unlink(s.holder, it->second.hash);
    h.blocks.erase(it);
    --entries_;
    ++h.evicted;
    ++totals_.blocks_evicted;
  }
  // Stale records (removed or re-stored blocks) would otherwise pile up while the live entries
  // stay under the budget.
  if (order_.size() > 2 * entries_ + 1024) compact_order();
}

void BlockIndex::apply(std::string_view node, uint32_t dp_rank, const proto::KvEventBatch& batch) {
  std::unique_lock lock(mu_);
  const HolderId id = holder_for(node, dp_rank);
  for (const proto::KvEvent& event : batch.events) {
    switch (event.kind) {
      case proto::KvEventKind::kBlockStored:
        store(id, event);
        break;
      case proto::KvEventKind::kBlockRemoved:
        for (const proto::EngineHash engine : event.block_hashes) remove(id, engine);
        break;
      case proto::KvEventKind::kAllBlocksCleared: {
        Holder& h = *holders_[id];
        for (const auto& [engine, entry] : h.blocks) unlink(id, entry.hash);
        h.removed += h.blocks.size();
        totals_.blocks_removed += h.blocks.size();
        entries_ -= h.blocks.size();
        h.blocks.clear();
        break;
      }
    }
  }
  enforce_budget();
}

void BlockIndex::drop_node(std::string_view node) {
  std::unique_lock lock(mu_);
  drop_holders(node, std::nullopt);
}

void BlockIndex::drop_rank(std::string_view node, uint32_t dp_rank) {
  std::unique_lock lock(mu_);
  drop_holders(node, dp_rank);
}

void BlockIndex::drop_holders(std::string_view node, std::optional<uint32_t> dp_rank) {
  for (auto it = holder_ids_.begin(); it != holder_ids_.end();) {
    if (it->first.first != node || (dp_rank && it->first.second != *dp_rank)) {
      ++it;
      continue;
    }
    const HolderId id = it->second;
    Holder& h = *holders_[id];
    for (const auto& [engine, entry] : h.blocks) unlink(id, entry.hash);
    totals_.blocks_removed += h.blocks.size();
    entries_ -= h.blocks.size();
    holders_[id].reset();  // budget records naming it are skipped, now and after reuse
    free_ids_.push_back(id);
    it = holder_ids_.erase(it);
  }
  if (order_.size() > 2 * entries_ + 1024) compact_order();
}

std::vector<PrefixMatch> BlockIndex::longest_prefix(std::span<const uint32_t> tokens,
                                                    std::optional<std::string_view> lora_name) const {
  std::shared_lock lock(mu_);
  // Block sizes in use (normally one for the whole fleet).
  std::vector<uint32_t> sizes;
  for (const auto& h : holders_) {
    if (h && h->block_size != 0 && std::find(sizes.begin(), sizes.end(), h->block_size) == sizes.end()) {
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
      auto it = holders_of_.find(parent);
      if (it == holders_of_.end()) break;
      bool any = false;
      for (const Holding& holding : it->second) {
        if (holders_[holding.holder]->block_size != size) continue;
        uint32_t& m = matched[holding.holder];
        if (m == i) {
          m = static_cast<uint32_t>(i + 1);
          any = true;
        }
      }
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
    if (!h || h->node != node) continue;
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
