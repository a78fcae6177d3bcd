#include "node/sim/kv_events_encode.h"

#include <optional>

#include <msgpack.hpp>

namespace pdr::node::sim {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

constexpr size_t kMaxGroups = 16;
constexpr uint32_t kMaxWindowTokens = 1u << 24;

void pack_str(Packer& p, std::string_view text) {
  p.pack_str(static_cast<uint32_t>(text.size()));
  p.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

template <typename T>
void pack_uints(Packer& p, std::span<const T> values) {
  p.pack_array(static_cast<uint32_t>(values.size()));
  for (T v : values) p.pack_uint64(v);
}

bool full_attention(std::string_view kind) {
  return kind == "full_attention" || kind == "mla_attention" || kind == "sink_full_attention";
}

// One BlockStored. `group`: its index and spec when the shape has groups (a placeholder names
// the group but not its spec, as vLLM's offloading connector does).
struct StoredEvent {
  std::span<const uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::span<const uint32_t> tokens;
  uint32_t block_size = 0;
  std::string_view medium = "GPU";
  bool local = false;  // map encoding: locality "LOCAL" (an offload tier's event)
  std::optional<uint32_t> group;
  const SimKvGroup* spec = nullptr;
};

void pack_stored(Packer& p, KvEventsEncoding encoding, const StoredEvent& e) {
  const bool map = encoding == KvEventsEncoding::kMap;
  const bool window = e.spec != nullptr && e.spec->window_tokens > 0;
  if (map) {
    p.pack_map(8 + (e.local ? 1 : 0) + (e.group ? 1 : 0) + (e.spec ? 1 : 0) + (window ? 1 : 0));
    pack_str(p, "type");
  } else {
    p.pack_array(e.group ? 12 : 8);
  }
  pack_str(p, "BlockStored");
  if (map) pack_str(p, "block_hashes");
  pack_uints(p, e.hashes);
  if (map) pack_str(p, "parent_block_hash");
  if (e.parent) {
    p.pack_uint64(*e.parent);
  } else {
    p.pack_nil();
  }
  if (map) pack_str(p, "token_ids");
  pack_uints(p, e.tokens);
  if (map) pack_str(p, "block_size");
  p.pack_uint32(e.block_size);
  if (map) pack_str(p, "lora_id");
  p.pack_nil();
  if (map) pack_str(p, "medium");
  pack_str(p, e.medium);
  if (map) pack_str(p, "lora_name");
  p.pack_nil();
  if (map) {
    if (e.local) pack_str(p, "locality"), pack_str(p, "LOCAL");
    if (e.group) pack_str(p, "group_idx"), p.pack_uint32(*e.group);
    if (e.spec) pack_str(p, "kv_cache_spec_kind"), pack_str(p, e.spec->kind);
    if (window) pack_str(p, "kv_cache_spec_sliding_window"), p.pack_uint32(e.spec->window_tokens);
  } else if (e.group) {
    p.pack_nil();  // extra_keys
    p.pack_uint32(*e.group);
    if (e.spec) {
      pack_str(p, e.spec->kind);
    } else {
      p.pack_nil();
    }
    if (window) {
      p.pack_uint32(e.spec->window_tokens);
    } else {
      p.pack_nil();
    }
  }
}

void pack_removed(Packer& p, KvEventsEncoding encoding, std::span<const uint64_t> hashes,
                  std::optional<uint32_t> group) {
  const bool map = encoding == KvEventsEncoding::kMap;
  if (map) {
    p.pack_map(group ? 4 : 3);
    pack_str(p, "type");
  } else {
    p.pack_array(group ? 4 : 3);
  }
  pack_str(p, "BlockRemoved");
  if (map) pack_str(p, "block_hashes");
  pack_uints(p, hashes);
  if (map) pack_str(p, "medium");
  pack_str(p, "GPU");
  if (group) {
    if (map) pack_str(p, "group_idx");
    p.pack_uint32(*group);
  }
}

// How many of a stored run's last blocks a group keeps (the rest it slides past at once).
size_t blocks_kept(const SimKvGroup& g, size_t blocks, uint32_t block_size) {
  if (g.window_tokens == 0 || block_size == 0) return blocks;
  return std::min<size_t>(blocks, (g.window_tokens + block_size - 1) / block_size);
}

// The batch's events, written one after another; counted for the array header.
class Events {
 public:
  explicit Events(KvEventsEncoding encoding) : encoding_(encoding) {}
  void stored(const StoredEvent& e) {
    pack_stored(packer_, encoding_, e);
    ++count_;
  }
  void removed(std::span<const uint64_t> hashes, std::optional<uint32_t> group) {
    if (hashes.empty()) return;
    pack_removed(packer_, encoding_, hashes, group);
    ++count_;
  }
  uint32_t count() const { return count_; }
  const msgpack::sbuffer& bytes() const { return buf_; }

 private:
  KvEventsEncoding encoding_;
  msgpack::sbuffer buf_;
  Packer packer_{buf_};
  uint32_t count_ = 0;
};

void add_stored(Events& out, const SimKvEventsShape& shape, uint32_t block_size, const PrefixCacheChange& c) {
  StoredEvent e{.hashes = c.hashes, .parent = c.parent, .tokens = c.tokens, .block_size = block_size};
  if (shape.groups.empty()) {
    out.stored(e);
  } else {
    for (uint32_t g = 0; g < shape.groups.size(); ++g) {
      const SimKvGroup& spec = shape.groups[g];
      e.group = g;
      e.spec = &spec;
      out.stored(e);
      const size_t slid = c.hashes.size() - blocks_kept(spec, c.hashes.size(), block_size);
      out.removed(std::span<const uint64_t>(c.hashes).first(slid), g);
    }
  }
  if (shape.cpu_tier == SimCpuTier::kNone) return;
  StoredEvent cpu = e;
  cpu.medium = "CPU";
  cpu.local = true;
  cpu.spec = nullptr;
  cpu.group.reset();
  if (shape.cpu_tier == SimCpuTier::kPlaceholder) {
    cpu.parent.reset();
    cpu.tokens = {};
    cpu.block_size = 0;
  }
  if (shape.groups.empty()) {
    out.stored(cpu);
    return;
  }
  for (uint32_t g = 0; g < shape.groups.size(); ++g) {
    if (!full_attention(shape.groups[g].kind)) continue;  // vLLM offloads full attention only
    cpu.group = g;
    cpu.spec = shape.cpu_tier == SimCpuTier::kSelfDescribing ? &shape.groups[g] : nullptr;
    out.stored(cpu);
  }
}

std::string finish(double ts, uint32_t dp_rank, const Events& events) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(events.count());
  buf.write(events.bytes().data(), events.bytes().size());
  p.pack_uint32(dp_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace

bool parse_kv_events_encoding(std::string_view text, KvEventsEncoding* out) {
  if (text == "map") {
    *out = KvEventsEncoding::kMap;
  } else if (text == "array") {
    *out = KvEventsEncoding::kArray;
  } else {
    return false;
  }
  return true;
}

bool parse_kv_events_groups(std::string_view text, std::vector<SimKvGroup>* out, std::string* error) {
  out->clear();
  if (text.empty()) return true;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    const size_t colon = item.find(':');
    SimKvGroup g;
    g.kind = std::string(item.substr(0, colon));
    const bool kind_ok = !g.kind.empty() && g.kind.size() <= 64 &&
                         g.kind.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
    if (!kind_ok) {
      *error = "group '" + std::string(item.substr(0, 64)) + "': expected KIND[:WINDOW], KIND in [a-z0-9_]";
      return false;
    }
    if (colon != std::string_view::npos) {
      const std::string_view window = item.substr(colon + 1);
      uint64_t w = 0;
      const bool digits = !window.empty() && window.size() <= 9 &&
                          window.find_first_not_of("0123456789") == std::string_view::npos;
      for (char c : window) w = w * 10 + static_cast<uint64_t>(c - '0');
      if (!digits || w == 0 || w > kMaxWindowTokens) {
        *error = "group '" + std::string(item.substr(0, 64)) + "': WINDOW must be 1.." + std::to_string(kMaxWindowTokens) +
                 " tokens";
        return false;
      }
      g.window_tokens = static_cast<uint32_t>(w);
    }
    if (out->size() == kMaxGroups) {
      *error = "at most " + std::to_string(kMaxGroups) + " groups";
      return false;
    }
    out->push_back(std::move(g));
  }
  return true;
}

bool parse_kv_events_cpu_tier(std::string_view text, SimCpuTier* out) {
  if (text == "none") {
    *out = SimCpuTier::kNone;
  } else if (text == "self-describing") {
    *out = SimCpuTier::kSelfDescribing;
  } else if (text == "placeholder") {
    *out = SimCpuTier::kPlaceholder;
  } else {
    return false;
  }
  return true;
}

std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, const SimKvEventsShape& shape, uint32_t block_size,
                                std::span<const PrefixCacheChange> changes) {
  Events events(shape.encoding);
  for (const PrefixCacheChange& c : changes) {
    if (c.stored) {
      add_stored(events, shape, block_size, c);
    } else if (shape.groups.empty()) {
      events.removed(c.hashes, std::nullopt);
    } else {
      for (uint32_t g = 0; g < shape.groups.size(); ++g) events.removed(c.hashes, g);
    }
  }
  return finish(ts, dp_rank, events);
}

std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding, uint32_t block_size,
                                std::span<const PrefixCacheChange> changes) {
  SimKvEventsShape shape;
  shape.encoding = encoding;
  return encode_sim_kv_batch(ts, dp_rank, shape, block_size, changes);
}

std::string encode_sim_kv_cleared_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(1);
  if (encoding == KvEventsEncoding::kMap) {
    p.pack_map(1);
    pack_str(p, "type");
  } else {
    p.pack_array(1);
  }
  pack_str(p, "AllBlocksCleared");
  p.pack_uint32(dp_rank);
  return std::string(buf.data(), buf.size());
}

}  // namespace pdr::node::sim
