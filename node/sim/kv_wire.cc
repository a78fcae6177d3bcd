#include "node/sim/kv_wire.h"

#include <cstring>

namespace pdr::node::sim {
namespace {

constexpr std::string_view kMagic = "PDKV";
constexpr uint8_t kVersion = 1;

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void raw(std::string_view s) { out_.append(s); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool u8(uint8_t* v) {
    if (in_.size() < 1) return false;
    *v = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return true;
  }
  bool u32(uint32_t* v) {
    if (in_.size() < 4) return false;
    *v = 0;
    for (int i = 0; i < 4; ++i) *v |= uint32_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(4);
    return true;
  }
  bool u64(uint64_t* v) {
    if (in_.size() < 8) return false;
    *v = 0;
    for (int i = 0; i < 8; ++i) *v |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(8);
    return true;
  }
  // A length-prefixed string of at most `limit` bytes.
  std::optional<std::string> str(std::string* s, size_t limit, const char* what) {
    uint32_t n = 0;
    if (!u32(&n)) return std::string("truncated ") + what;
    if (n > limit) return std::string(what) + " longer than " + std::to_string(limit) + " bytes";
    if (in_.size() < n) return std::string("truncated ") + what;
    s->assign(in_.substr(0, n));
    in_.remove_prefix(n);
    return std::nullopt;
  }
  bool prefix(std::string_view p) {
    if (!in_.starts_with(p)) return false;
    in_.remove_prefix(p.size());
    return true;
  }
  size_t left() const { return in_.size(); }

 private:
  std::string_view in_;
};

void put_shape(Writer& w, const KvMessage& m) {
  w.str(m.descriptor);
  w.u32(m.layout);
  w.u64(m.block_bytes);
  w.u32(m.layers);
}

std::optional<std::string> get_shape(Reader& r, KvMessage* m) {
  if (auto e = r.str(&m->descriptor, kMaxKvDescriptorBytes, "descriptor")) return e;
  if (!r.u32(&m->layout) || !r.u64(&m->block_bytes) || !r.u32(&m->layers)) {
    return std::string("truncated layout shape");
  }
  return std::nullopt;
}

}  // namespace

std::string encode_kv_message(const KvMessage& m) {
  Writer w;
  w.raw(kMagic);
  w.u8(kVersion);
  w.u8(static_cast<uint8_t>(m.type));
  switch (m.type) {
    case KvMessageType::kDescribe:
    case KvMessageType::kAck: break;
    case KvMessageType::kDescriptor: put_shape(w, m); break;
    case KvMessageType::kWriteRequest:
      w.str(m.key);
      put_shape(w, m);
      w.u32(static_cast<uint32_t>(m.blocks.size()));
      for (uint32_t b : m.blocks) w.u32(b);
      break;
    case KvMessageType::kError: w.str(m.error); break;
  }
  return w.take();
}

std::optional<std::string> decode_kv_message(std::string_view bytes, KvMessage* out) {
  *out = KvMessage{};
  if (bytes.size() > kMaxKvMessageBytes) return "message larger than 1 MiB";
  Reader r(bytes);
  if (!r.prefix(kMagic)) return "bad magic (not a pdnode sim KV message)";
  uint8_t version = 0;
  uint8_t type = 0;
  if (!r.u8(&version) || !r.u8(&type)) return "truncated header";
  if (version != kVersion) return "unsupported version " + std::to_string(version);
  out->type = static_cast<KvMessageType>(type);
  switch (out->type) {
    case KvMessageType::kDescribe:
    case KvMessageType::kAck: break;
    case KvMessageType::kDescriptor:
      if (auto e = get_shape(r, out)) return e;
      break;
    case KvMessageType::kWriteRequest: {
      if (auto e = r.str(&out->key, kMaxKvKeyBytes, "key")) return e;
      if (out->key.empty()) return "empty key";
      if (auto e = get_shape(r, out)) return e;
      uint32_t count = 0;
      if (!r.u32(&count)) return "truncated block count";
      if (count > kMaxKvBlocksPerMessage) return "more than 65536 blocks";
      if (r.left() < size_t{count} * 4) return "truncated block ids";
      out->blocks.resize(count);
      for (uint32_t& b : out->blocks) r.u32(&b);
      break;
    }
    case KvMessageType::kError:
      if (auto e = r.str(&out->error, kMaxKvErrorBytes, "error")) return e;
      break;
    default: return "unknown message type " + std::to_string(type);
  }
  if (r.left() != 0) return std::to_string(r.left()) + " trailing bytes";
  return std::nullopt;
}

}  // namespace pdr::node::sim
