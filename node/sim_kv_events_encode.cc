#include "node/sim_kv_events_encode.h"

#include <msgpack.hpp>

namespace pdr::node::sim {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& p, std::string_view text) {
  p.pack_str(static_cast<uint32_t>(text.size()));
  p.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

template <typename T>
void pack_uints(Packer& p, const std::vector<T>& values) {
  p.pack_array(static_cast<uint32_t>(values.size()));
  for (T v : values) p.pack_uint64(v);
}

void pack_stored(Packer& p, KvEventsEncoding encoding, uint32_t block_size,
                 const PrefixCacheChange& c) {
  const bool map = encoding == KvEventsEncoding::kMap;
  if (map) {
    p.pack_map(8);
    pack_str(p, "type");
  } else {
    p.pack_array(8);
  }
  pack_str(p, "BlockStored");
  if (map) pack_str(p, "block_hashes");
  pack_uints(p, c.hashes);
  if (map) pack_str(p, "parent_block_hash");
  if (c.parent) {
    p.pack_uint64(*c.parent);
  } else {
    p.pack_nil();
  }
  if (map) pack_str(p, "token_ids");
  pack_uints(p, c.tokens);
  if (map) pack_str(p, "block_size");
  p.pack_uint32(block_size);
  if (map) pack_str(p, "lora_id");
  p.pack_nil();
  if (map) pack_str(p, "medium");
  pack_str(p, "GPU");
  if (map) pack_str(p, "lora_name");
  p.pack_nil();
}

void pack_removed(Packer& p, KvEventsEncoding encoding, const PrefixCacheChange& c) {
  const bool map = encoding == KvEventsEncoding::kMap;
  if (map) {
    p.pack_map(3);
    pack_str(p, "type");
  } else {
    p.pack_array(3);
  }
  pack_str(p, "BlockRemoved");
  if (map) pack_str(p, "block_hashes");
  pack_uints(p, c.hashes);
  if (map) pack_str(p, "medium");
  pack_str(p, "GPU");
}

void pack_header(Packer& p, double ts, uint32_t events) {
  p.pack_array(3);
  p.pack_double(ts);
  p.pack_array(events);
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

std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding,
                                uint32_t block_size, std::span<const PrefixCacheChange> changes) {
  msgpack::sbuffer buf;
  Packer p(buf);
  pack_header(p, ts, static_cast<uint32_t>(changes.size()));
  for (const PrefixCacheChange& c : changes) {
    if (c.stored) {
      pack_stored(p, encoding, block_size, c);
    } else {
      pack_removed(p, encoding, c);
    }
  }
  p.pack_uint32(dp_rank);
  return std::string(buf.data(), buf.size());
}

std::string encode_sim_kv_cleared_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding) {
  msgpack::sbuffer buf;
  Packer p(buf);
  pack_header(p, ts, 1);
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
