#include "proto/kv_events.h"

#include <algorithm>
#include <string>

#include "proto/msgpack_fields.h"
#include "proto/msgpack_limits.h"

namespace pdr::proto {

namespace {

using msgpack::type::object_type;

// batch -> events -> event -> extra_keys -> one block's keys -> a (identifier, offset) tuple,
// with headroom: deeper is not something vLLM sends.
constexpr size_t kMaxDepth = 8;
constexpr size_t kMaxEventFields = 64;
constexpr uint64_t kMaxBlockSize = 1u << 20;
constexpr uint64_t kMaxUint32 = 0xFFFFFFFFu;

// Positional field counts (tag included) of the fields this decoder knows, per event type; more
// are counted as unknown. BlockStored: tag, block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
// kv_cache_spec_sliding_window.
constexpr uint32_t kStoredPositional = 12;
constexpr uint32_t kRemovedPositional = 4;  // tag, block_hashes, medium, group_idx
constexpr uint32_t kClearedPositional = 1;
// Fields only the map encoding carries (added after it): no positional slot.
constexpr uint32_t kMapOnly = ~uint32_t{0};

std::string at_event(size_t index, std::string_view field) {
  return "event " + std::to_string(index) + " " + std::string(field);
}

bool is_nil(const msgpack::object* v) { return v == nullptr || v->type == object_type::NIL; }

// One event's fields, whichever encoding: positional slots or map keys, looked up by name.
class EventFields {
 public:
  static EventFields positional(const msgpack::object& array) {
    EventFields f;
    f.array_ = &array;
    return f;
  }
  static EventFields named(const FieldMap& map) {
    EventFields f;
    f.map_ = &map;
    return f;
  }
  // The field at `slot` (positional) or under `name` (map); nullptr when absent.
  const msgpack::object* get(uint32_t slot, std::string_view name) const {
    if (map_ != nullptr) return map_->find(name);
    return slot != kMapOnly && slot < array_->via.array.size ? &array_->via.array.ptr[slot] : nullptr;
  }

 private:
  const msgpack::object* array_ = nullptr;
  const FieldMap* map_ = nullptr;
};

Status read_hash(const msgpack::object& v, size_t event, std::string_view field,
                 const KvEventLimits& limits, EngineHash* out) {
  switch (v.type) {
    case object_type::POSITIVE_INTEGER:
      *out = v.via.u64;
      return Status::ok();
    case object_type::NEGATIVE_INTEGER:
      return Status(StatusCode::kOutOfRange, at_event(event, field) + " holds a negative hash " +
                                                 std::to_string(v.via.i64));
    case object_type::BIN:
    case object_type::STR: {
      const uint32_t size = v.type == object_type::BIN ? v.via.bin.size : v.via.str.size;
      const char* bytes = v.type == object_type::BIN ? v.via.bin.ptr : v.via.str.ptr;
      if (size == 0 || size > limits.max_hash_bytes) {
        return Status(StatusCode::kOutOfRange, at_event(event, field) + " holds a " + std::to_string(size) +
                                                   "-byte hash (1.." + std::to_string(limits.max_hash_bytes) +
                                                   " bytes)");
      }
      // vLLM's integer form is int.from_bytes(digest, "big") & (2**64 - 1): the last 8 bytes.
      EngineHash h = 0;
      for (uint32_t i = size > 8 ? size - 8 : 0; i < size; ++i) h = (h << 8) | static_cast<uint8_t>(bytes[i]);
      *out = h;
      return Status::ok();
    }
    default:
      return Status(StatusCode::kWrongType, at_event(event, field) + " must be an integer or bytes, got " +
                                                std::string(msgpack_type_name(v)));
  }
}

Status read_hashes(const msgpack::object* v, size_t event, const KvEventLimits& limits,
                   std::vector<EngineHash>* out) {
  if (v == nullptr) return Status(StatusCode::kMissingKey, at_event(event, "block_hashes") + " is required");
  if (v->type != object_type::ARRAY) {
    return Status(StatusCode::kWrongType,
                  at_event(event, "block_hashes") + " must be an array, got " + std::string(msgpack_type_name(*v)));
  }
  if (v->via.array.size > limits.max_blocks) {
    return Status(StatusCode::kTooLarge, at_event(event, "block_hashes") + " has " +
                                             std::to_string(v->via.array.size) + " entries, limit " +
                                             std::to_string(limits.max_blocks));
  }
  out->resize(v->via.array.size);
  for (uint32_t i = 0; i < v->via.array.size; ++i) {
    if (Status s = read_hash(v->via.array.ptr[i], event, "block_hashes", limits, &(*out)[i]); !s) return s;
  }
  return Status::ok();
}

Status read_tokens(const msgpack::object* v, size_t event, const KvEventLimits& limits, std::vector<uint32_t>* out) {
  if (is_nil(v)) return Status::ok();  // CPU offload events carry no tokens
  if (v->type != object_type::ARRAY) {
    return Status(StatusCode::kWrongType,
                  at_event(event, "token_ids") + " must be an array, got " + std::string(msgpack_type_name(*v)));
  }
  if (v->via.array.size > limits.max_tokens) {
    return Status(StatusCode::kTooLarge, at_event(event, "token_ids") + " has " + std::to_string(v->via.array.size) +
                                             " entries, limit " + std::to_string(limits.max_tokens));
  }
  out->resize(v->via.array.size);
  for (uint32_t i = 0; i < v->via.array.size; ++i) {
    uint64_t token = 0;
    if (Status s = as_uint(v->via.array.ptr[i], at_event(event, "token_ids"), 0, kMaxUint32, &token); !s) return s;
    (*out)[i] = static_cast<uint32_t>(token);
  }
  return Status::ok();
}

Status read_optional_string(const msgpack::object* v, size_t event, std::string_view field,
                            const KvEventLimits& limits, std::optional<std::string>* out) {
  if (is_nil(v)) return Status::ok();
  std::string text;
  if (Status s = as_string(*v, at_event(event, field), limits.max_string_bytes, &text); !s) return s;
  *out = std::move(text);
  return Status::ok();
}

Status read_optional_int(const msgpack::object* v, size_t event, std::string_view field, std::optional<int64_t>* out) {
  if (is_nil(v)) return Status::ok();
  if (v->type == object_type::POSITIVE_INTEGER && v->via.u64 <= static_cast<uint64_t>(INT64_MAX)) {
    *out = static_cast<int64_t>(v->via.u64);
  } else if (v->type == object_type::NEGATIVE_INTEGER) {
    *out = v->via.i64;
  } else {
    return Status(StatusCode::kWrongType,
                  at_event(event, field) + " must be an integer, got " + std::string(msgpack_type_name(*v)));
  }
  return Status::ok();
}

Status read_common(const EventFields& f, size_t event, const KvEventLimits& limits, uint32_t medium_slot,
                   uint32_t group_slot, KvEvent* out) {
  std::optional<std::string> medium;
  if (Status s = read_optional_string(f.get(medium_slot, "medium"), event, "medium", limits, &medium); !s) return s;
  out->medium = medium.value_or("");
  if (Status s = read_optional_string(f.get(kMapOnly, "locality"), event, "locality", limits, &out->locality); !s) {
    return s;
  }
  if (Status s = read_optional_int(f.get(group_slot, "group_idx"), event, "group_idx", &out->group_idx); !s) return s;
  if (out->group_idx && (*out->group_idx < 0 || *out->group_idx > kMaxKvGroupIdx)) {
    return Status(StatusCode::kOutOfRange, at_event(event, "group_idx") + " " + std::to_string(*out->group_idx) +
                                               " is out of range 0.." + std::to_string(kMaxKvGroupIdx));
  }
  return Status::ok();
}

// Whether `key` is the LoRA adapter's own extra key, which vLLM puts first in every block's
// extra keys of an adapter's request (its name; its integer id in older versions).
bool is_lora_key(const msgpack::object& key, const KvEvent& e) {
  if (key.type == object_type::STR) return e.lora_name && str_view(key) == *e.lora_name;
  if (key.type == object_type::POSITIVE_INTEGER) {
    return e.lora_id && *e.lora_id >= 0 && key.via.u64 == static_cast<uint64_t>(*e.lora_id);
  }
  return false;
}

// extra_keys: one entry per block, nil or a tuple (an array) of keys. Each kept entry is
// re-encoded canonically without the adapter's own key (KvEvent::extra_keys).
Status read_extra_keys(const msgpack::object* v, size_t event, const KvEventLimits& limits, KvEvent* out) {
  if (is_nil(v)) return Status::ok();
  if (v->type != object_type::ARRAY) {
    return Status(StatusCode::kWrongType,
                  at_event(event, "extra_keys") + " must be an array, got " + std::string(msgpack_type_name(*v)));
  }
  if (v->via.array.size > limits.max_blocks) {
    return Status(StatusCode::kTooLarge, at_event(event, "extra_keys") + " has " + std::to_string(v->via.array.size) +
                                             " entries, limit " + std::to_string(limits.max_blocks));
  }
  bool any = false;
  out->extra_keys.resize(v->via.array.size);
  for (uint32_t i = 0; i < v->via.array.size; ++i) {
    const msgpack::object& entry = v->via.array.ptr[i];
    if (is_nil(&entry)) continue;
    // A tuple is an array; anything else (not what vLLM sends) counts as a one-key tuple.
    const bool tuple = entry.type == object_type::ARRAY;
    const msgpack::object* keys = tuple ? entry.via.array.ptr : &entry;
    const uint32_t n = tuple ? entry.via.array.size : 1;
    const uint32_t first = n > 0 && is_lora_key(keys[0], *out) ? 1 : 0;
    if (first == n) continue;
    StringBuffer canonical;
    Packer packer(canonical);
    packer.pack_array(n - first);
    for (uint32_t k = first; k < n; ++k) packer.pack(keys[k]);
    out->extra_keys[i] = std::move(canonical.data);
    any = true;
  }
  if (!any) out->extra_keys.clear();  // nil everywhere (or the adapter's key alone): none
  return Status::ok();
}

Status read_stored(const EventFields& f, size_t event, const KvEventLimits& limits, KvEvent* out) {
  out->kind = KvEventKind::kBlockStored;
  if (Status s = read_hashes(f.get(1, "block_hashes"), event, limits, &out->block_hashes); !s) return s;
  if (const msgpack::object* parent = f.get(2, "parent_block_hash"); !is_nil(parent)) {
    EngineHash h = 0;
    if (Status s = read_hash(*parent, event, "parent_block_hash", limits, &h); !s) return s;
    out->parent_block_hash = h;
  }
  if (Status s = read_tokens(f.get(3, "token_ids"), event, limits, &out->token_ids); !s) return s;
  const msgpack::object* block_size = f.get(4, "block_size");
  if (block_size == nullptr) return Status(StatusCode::kMissingKey, at_event(event, "block_size") + " is required");
  uint64_t size = 0;
  // 0: an offload tier's placeholder store (engine keys and a tier, no tokens).
  if (Status s = as_uint(*block_size, at_event(event, "block_size"), 0, kMaxBlockSize, &size); !s) return s;
  out->block_size = static_cast<uint32_t>(size);
  if (Status s = read_optional_int(f.get(5, "lora_id"), event, "lora_id", &out->lora_id); !s) return s;
  if (Status s = read_optional_string(f.get(7, "lora_name"), event, "lora_name", limits, &out->lora_name); !s) return s;
  if (Status s = read_extra_keys(f.get(8, "extra_keys"), event, limits, out); !s) return s;
  if (Status s = read_optional_string(f.get(10, "kv_cache_spec_kind"), event, "kv_cache_spec_kind", limits,
                                      &out->kv_cache_spec_kind);
      !s) {
    return s;
  }
  if (Status s = read_optional_int(f.get(11, "kv_cache_spec_sliding_window"), event, "kv_cache_spec_sliding_window",
                                   &out->kv_cache_spec_sliding_window);
      !s) {
    return s;
  }
  return read_common(f, event, limits, 6, 9, out);
}

// Map keys each event type is read from (or knowingly ignores); others count as unknown.
bool known_key(KvEventKind kind, std::string_view key) {
  // ownership (the offloading tier that produced the event) and session_id (the request context)
  // are known and not needed: matching does not depend on them.
  static constexpr std::string_view kStored[] = {
      "type",      "block_hashes", "parent_block_hash", "token_ids",          "block_size",
      "lora_id",   "medium",       "lora_name",         "extra_keys",         "group_idx",
      "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership", "session_id"};
  static constexpr std::string_view kRemoved[] = {"type", "block_hashes", "medium", "group_idx",
                                                  "locality", "ownership", "session_id"};
  switch (kind) {
    case KvEventKind::kBlockStored: return std::find(std::begin(kStored), std::end(kStored), key) != std::end(kStored);
    case KvEventKind::kBlockRemoved: return std::find(std::begin(kRemoved), std::end(kRemoved), key) != std::end(kRemoved);
    case KvEventKind::kAllBlocksCleared: return key == "type";
  }
  return false;
}

std::optional<KvEventKind> kind_of(std::string_view tag) {
  if (tag == "BlockStored") return KvEventKind::kBlockStored;
  if (tag == "BlockRemoved") return KvEventKind::kBlockRemoved;
  if (tag == "AllBlocksCleared") return KvEventKind::kAllBlocksCleared;
  return std::nullopt;
}

// One event into *out; *known = false for a type this decoder does not know (skipped).
Status decode_event(const msgpack::object& v, size_t index, const KvEventLimits& limits, KvEvent* out, bool* known,
                    size_t* unknown_fields) {
  FieldMap map;
  const msgpack::object* tag = nullptr;
  if (v.type == object_type::ARRAY) {
    if (v.via.array.size == 0) return Status(StatusCode::kMalformed, "event " + std::to_string(index) + " is an empty array");
    tag = &v.via.array.ptr[0];
  } else if (v.type == object_type::MAP) {
    if (v.via.map.size > kMaxEventFields) {
      return Status(StatusCode::kTooLarge, "event " + std::to_string(index) + " has " +
                                               std::to_string(v.via.map.size) + " fields, limit " +
                                               std::to_string(kMaxEventFields));
    }
    if (Status s = FieldMap::build(v, "event " + std::to_string(index), &map); !s) return s;
    tag = map.find("type");
    if (tag == nullptr) return Status(StatusCode::kMissingKey, at_event(index, "type") + " is required");
  } else {
    return Status(StatusCode::kWrongType, "event " + std::to_string(index) + " must be an array or a map, got " +
                                              std::string(msgpack_type_name(v)));
  }
  std::string tag_text;
  if (Status s = as_string(*tag, at_event(index, "type"), limits.max_string_bytes, &tag_text); !s) return s;
  const std::optional<KvEventKind> kind = kind_of(tag_text);
  *known = kind.has_value();
  if (!kind) return Status::ok();
  if (v.type == object_type::MAP) {
    for (const auto& [key, value] : map.entries()) {
      if (!known_key(*kind, key)) ++*unknown_fields;
    }
  } else {
    const uint32_t positional = *kind == KvEventKind::kBlockStored    ? kStoredPositional
                                : *kind == KvEventKind::kBlockRemoved ? kRemovedPositional
                                                                      : kClearedPositional;
    if (v.via.array.size > positional) *unknown_fields += v.via.array.size - positional;
  }
  const EventFields fields = v.type == object_type::MAP ? EventFields::named(map) : EventFields::positional(v);
  *out = KvEvent{};
  switch (*kind) {
    case KvEventKind::kBlockStored: return read_stored(fields, index, limits, out);
    case KvEventKind::kBlockRemoved:
      out->kind = KvEventKind::kBlockRemoved;
      if (Status s = read_hashes(fields.get(1, "block_hashes"), index, limits, &out->block_hashes); !s) return s;
      return read_common(fields, index, limits, 2, 3, out);
    case KvEventKind::kAllBlocksCleared:
      out->kind = KvEventKind::kAllBlocksCleared;
      return Status::ok();
  }
  return Status::ok();
}

}  // namespace

Status decode_kv_event_batch(std::span<const std::byte> payload, const KvEventLimits& limits, KvEventBatch* out) {
  *out = KvEventBatch{};
  DecodeLimits unpack_limits;
  unpack_limits.max_message_bytes = limits.max_payload_bytes;
  unpack_limits.max_depth = kMaxDepth;
  // One more than the largest list limit, so that an over-long list gets the message naming it.
  unpack_limits.max_array_items = std::max({limits.max_events, limits.max_blocks, limits.max_tokens}) + 1;
  unpack_limits.max_map_entries = kMaxEventFields + 1;
  // A str or bin is copied only once all its bytes are present, so the payload size bounds them;
  // the per-field limits are applied afterwards.
  unpack_limits.max_string_bytes = limits.max_payload_bytes;
  unpack_limits.max_bin_bytes = limits.max_payload_bytes;
  msgpack::object_handle handle;
  if (Status s = unpack_bounded(payload, unpack_limits, &handle); !s) return s;
  const msgpack::object& root = handle.get();
  // The batch's three fields, positional or (a batch struct without array_like) by name.
  const msgpack::object* ts = nullptr;
  const msgpack::object* events_field = nullptr;
  const msgpack::object* rank_field = nullptr;
  FieldMap batch_map;
  if (root.type == object_type::ARRAY && root.via.array.size >= 2) {
    ts = &root.via.array.ptr[0];
    events_field = &root.via.array.ptr[1];
    if (root.via.array.size >= 3) rank_field = &root.via.array.ptr[2];
    if (root.via.array.size > 3) out->unknown_fields += root.via.array.size - 3;
  } else if (root.type == object_type::MAP) {
    if (Status s = FieldMap::build(root, "batch", &batch_map); !s) return s;
    ts = batch_map.find("ts");
    events_field = batch_map.find("events");
    rank_field = batch_map.find("data_parallel_rank");
    if (ts == nullptr || events_field == nullptr) {
      return Status(StatusCode::kMissingKey, "a KV event batch map needs ts and events");
    }
    for (const auto& [key, value] : batch_map.entries()) {
      if (key != "ts" && key != "events" && key != "data_parallel_rank") ++out->unknown_fields;
    }
  } else {
    return Status(StatusCode::kWrongType, "a KV event batch must be an array [ts, events, dp_rank?] or a map, got " +
                                              (root.type == object_type::ARRAY
                                                   ? "an array of " + std::to_string(root.via.array.size)
                                                   : std::string(msgpack_type_name(root))));
  }
  if (ts->type == object_type::FLOAT32 || ts->type == object_type::FLOAT64) {
    out->ts = ts->via.f64;
  } else if (ts->type == object_type::POSITIVE_INTEGER) {
    out->ts = static_cast<double>(ts->via.u64);
  } else {
    *out = KvEventBatch{};
    return Status(StatusCode::kWrongType, "batch ts must be a number, got " + std::string(msgpack_type_name(*ts)));
  }
  const msgpack::object& events = *events_field;
  if (events.type != object_type::ARRAY) {
    *out = KvEventBatch{};
    return Status(StatusCode::kWrongType, "batch events must be an array, got " + std::string(msgpack_type_name(events)));
  }
  if (events.via.array.size > limits.max_events) {
    *out = KvEventBatch{};
    return Status(StatusCode::kTooLarge, "batch has " + std::to_string(events.via.array.size) + " events, limit " +
                                             std::to_string(limits.max_events));
  }
  if (rank_field != nullptr) {
    std::optional<int64_t> rank;
    if (Status s = read_optional_int(rank_field, 0, "dp_rank", &rank); !s) {
      *out = KvEventBatch{};
      return Status(StatusCode::kWrongType,
                    "batch dp_rank must be an integer or nil, got " + std::string(msgpack_type_name(*rank_field)));
    }
    if (rank && *rank < 0) {
      *out = KvEventBatch{};
      return Status(StatusCode::kOutOfRange, "batch dp_rank " + std::to_string(*rank) + " is negative");
    }
    out->dp_rank = rank;
  }
  out->events.reserve(events.via.array.size);
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    KvEvent event;
    bool known = false;
    if (Status s = decode_event(events.via.array.ptr[i], i, limits, &event, &known, &out->unknown_fields); !s) {
      *out = KvEventBatch{};
      return s;
    }
    if (known) {
      out->events.push_back(std::move(event));
    } else {
      ++out->unknown_events;
    }
  }
  return Status::ok();
}

std::string kv_extra_keys_for_cache_salt(std::string_view salt) {
  StringBuffer canonical;
  Packer packer(canonical);
  packer.pack_array(1);
  pack_string(packer, salt);
  return std::move(canonical.data);
}

Status decode_kv_event_seq(std::span<const std::byte> frame, uint64_t* out) {
  if (frame.size() != 8) {
    return Status(StatusCode::kMalformed, "a KV event seq frame is 8 bytes, got " + std::to_string(frame.size()));
  }
  uint64_t seq = 0;
  for (const std::byte b : frame) seq = (seq << 8) | static_cast<uint8_t>(b);
  *out = seq;
  return Status::ok();
}

std::string encode_kv_event_seq(uint64_t seq) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[static_cast<size_t>(i)] = static_cast<char>(seq & 0xFF);
    seq >>= 8;
  }
  return out;
}

}  // namespace pdr::proto
