#include "transfer/shm/shm_wire.h"

#include <cstring>

namespace pdr::transfer::shm {
namespace {

void put_u16(std::string* out, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void put_u32(std::string* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void put_u64(std::string* out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
std::uint64_t get_le(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

std::string frame(MsgType type, std::size_t body_len) {
  std::string out;
  out.reserve(kFrameHeaderBytes + body_len);
  put_u16(&out, kFrameMagic);
  put_u16(&out, static_cast<std::uint16_t>(type));
  put_u32(&out, static_cast<std::uint32_t>(body_len));
  return out;
}

Status bad_size(std::string_view what, std::size_t got, std::string_view expected) {
  return Status(StatusCode::kMalformed, std::string(what) + " body is " + std::to_string(got) +
                                            " bytes, expected " + std::string(expected));
}

}  // namespace

std::string encode_hello(std::string_view agent) {
  std::string out = frame(MsgType::kHello, agent.size());
  out.append(agent);
  return out;
}

std::string encode_region_query(std::uint32_t region_id) {
  std::string out = frame(MsgType::kRegionQuery, 4);
  put_u32(&out, region_id);
  return out;
}

std::string encode_region(const RegionInfo& region) {
  std::string out = frame(MsgType::kRegion, 24);
  put_u32(&out, region.id);
  put_u32(&out, region.flags);
  put_u64(&out, region.length);
  put_u64(&out, region.addr);
  return out;
}

std::string encode_regions_end(std::uint32_t region_id) {
  std::string out = frame(MsgType::kRegionsEnd, 4);
  put_u32(&out, region_id);
  return out;
}

std::string encode_notify(std::uint64_t seq, std::string_view message) {
  std::string out = frame(MsgType::kNotify, 8 + message.size());
  put_u64(&out, seq);
  out.append(message);
  return out;
}

std::string encode_notify_ack(std::uint64_t seq) {
  std::string out = frame(MsgType::kNotifyAck, 8);
  put_u64(&out, seq);
  return out;
}

Status decode_frame(std::span<const std::byte> bytes, Frame* out, std::size_t* consumed) {
  *consumed = 0;
  if (bytes.size() < kFrameHeaderBytes) return {};
  const auto magic = static_cast<std::uint16_t>(get_le(bytes.data(), 2));
  if (magic != kFrameMagic) {
    return Status(StatusCode::kMalformed, "frame magic " + std::to_string(magic) + " is not 0x5053");
  }
  const auto type = static_cast<std::uint16_t>(get_le(bytes.data() + 2, 2));
  const std::uint64_t body_len = get_le(bytes.data() + 4, 4);
  if (body_len > kMaxBodyBytes) {
    return Status(StatusCode::kTooLarge, "frame body_len " + std::to_string(body_len) +
                                             " exceeds limit " + std::to_string(kMaxBodyBytes));
  }
  if (type < static_cast<std::uint16_t>(MsgType::kHello) ||
      type > static_cast<std::uint16_t>(MsgType::kNotifyAck)) {
    return Status(StatusCode::kUnknownType, "frame type " + std::to_string(type) + " is unknown");
  }
  // Validate the header fully before waiting for the body, so garbage fails fast.
  const auto msg = static_cast<MsgType>(type);
  const std::size_t n = static_cast<std::size_t>(body_len);
  switch (msg) {
    case MsgType::kHello:
      if (n == 0 || n > kMaxAgentBytes) return bad_size("hello", n, "1..256");
      break;
    case MsgType::kRegionQuery:
    case MsgType::kRegionsEnd:
      if (n != 4) return bad_size("region query/end", n, "4");
      break;
    case MsgType::kRegion:
      if (n != 24) return bad_size("region", n, "24");
      break;
    case MsgType::kNotify:
      if (n < 8) return bad_size("notify", n, "8..65544");
      break;
    case MsgType::kNotifyAck:
      if (n != 8) return bad_size("notify ack", n, "8");
      break;
  }
  if (bytes.size() < kFrameHeaderBytes + n) return {};
  const std::byte* body = bytes.data() + kFrameHeaderBytes;
  Frame frame;
  frame.type = msg;
  switch (msg) {
    case MsgType::kHello:
      frame.text = std::string_view(reinterpret_cast<const char*>(body), n);
      break;
    case MsgType::kRegionQuery:
    case MsgType::kRegionsEnd:
      frame.region_id = static_cast<std::uint32_t>(get_le(body, 4));
      break;
    case MsgType::kRegion: {
      frame.region.id = static_cast<std::uint32_t>(get_le(body, 4));
      frame.region.flags = static_cast<std::uint32_t>(get_le(body + 4, 4));
      frame.region.length = get_le(body + 8, 8);
      frame.region.addr = get_le(body + 16, 8);
      const std::uint32_t kind = frame.region.flags & (kRegionHasFd | kRegionCma);
      if ((frame.region.flags & ~(kRegionHasFd | kRegionCma)) != 0 ||
          (kind != kRegionHasFd && kind != kRegionCma)) {
        return Status(StatusCode::kMalformed,
                      "region flags " + std::to_string(frame.region.flags) + " are invalid");
      }
      if (frame.region.id == 0 || frame.region.length == 0) {
        return Status(StatusCode::kMalformed, "region id and length must be non-zero");
      }
      if (kind == kRegionCma && (frame.region.addr == 0 ||
                                 frame.region.addr + frame.region.length < frame.region.addr)) {
        return Status(StatusCode::kMalformed, "region address range is invalid");
      }
      break;
    }
    case MsgType::kNotify:
      frame.seq = get_le(body, 8);
      frame.text = std::string_view(reinterpret_cast<const char*>(body) + 8, n - 8);
      break;
    case MsgType::kNotifyAck:
      frame.seq = get_le(body, 8);
      break;
  }
  *out = frame;
  *consumed = kFrameHeaderBytes + n;
  return {};
}

}  // namespace pdr::transfer::shm
