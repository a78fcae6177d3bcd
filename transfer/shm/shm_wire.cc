#include "transfer/shm/shm_wire.h"

#include "proto/little_endian.h"

#include <cstring>

namespace pdr::transfer::shm {
namespace {

std::string frame(MsgType type, std::size_t body_len) {
  std::string out;
  out.reserve(kFrameHeaderBytes + body_len);
  proto::append_le<std::uint16_t>(&out, kFrameMagic);
  proto::append_le<std::uint16_t>(&out, static_cast<std::uint16_t>(type));
  proto::append_le<std::uint32_t>(&out, static_cast<std::uint32_t>(body_len));
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
  proto::append_le<std::uint32_t>(&out, region_id);
  return out;
}

std::string encode_region(const RegionInfo& region) {
  std::string out = frame(MsgType::kRegion, 24);
  proto::append_le<std::uint32_t>(&out, region.id);
  proto::append_le<std::uint32_t>(&out, region.flags);
  proto::append_le<std::uint64_t>(&out, region.length);
  proto::append_le<std::uint64_t>(&out, region.addr);
  return out;
}

std::string encode_regions_end(std::uint32_t region_id) {
  std::string out = frame(MsgType::kRegionsEnd, 4);
  proto::append_le<std::uint32_t>(&out, region_id);
  return out;
}

std::string encode_notify(std::uint64_t seq, std::string_view message) {
  std::string out = frame(MsgType::kNotify, 8 + message.size());
  proto::append_le<std::uint64_t>(&out, seq);
  out.append(message);
  return out;
}

std::string encode_notify_ack(std::uint64_t seq) {
  std::string out = frame(MsgType::kNotifyAck, 8);
  proto::append_le<std::uint64_t>(&out, seq);
  return out;
}

std::string encode_region_revoke(std::uint32_t region_id) {
  std::string out = frame(MsgType::kRegionRevoke, 4);
  proto::append_le<std::uint32_t>(&out, region_id);
  return out;
}

std::string encode_revoke_ack(std::uint32_t region_id) {
  std::string out = frame(MsgType::kRevokeAck, 4);
  proto::append_le<std::uint32_t>(&out, region_id);
  return out;
}

Status decode_frame(std::span<const std::byte> bytes, Frame* out, std::size_t* consumed) {
  *consumed = 0;
  if (bytes.size() < kFrameHeaderBytes) return {};
  const auto magic = static_cast<std::uint16_t>(proto::get_le<std::uint16_t>(bytes.data()));
  if (magic != kFrameMagic) {
    return Status(StatusCode::kMalformed, "frame magic " + std::to_string(magic) + " is not 0x5053");
  }
  const auto type = static_cast<std::uint16_t>(proto::get_le<std::uint16_t>(bytes.data() + 2));
  const std::uint64_t body_len = proto::get_le<std::uint32_t>(bytes.data() + 4);
  if (body_len > kMaxBodyBytes) {
    return Status(StatusCode::kTooLarge, "frame body_len " + std::to_string(body_len) +
                                             " exceeds limit " + std::to_string(kMaxBodyBytes));
  }
  if (type < static_cast<std::uint16_t>(MsgType::kHello) ||
      type > static_cast<std::uint16_t>(MsgType::kRevokeAck)) {
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
    case MsgType::kRegionRevoke:
    case MsgType::kRevokeAck:
      if (n != 4) return bad_size("region query/end/revoke", n, "4");
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
    case MsgType::kRegionRevoke:
    case MsgType::kRevokeAck:
      frame.region_id = proto::get_le<std::uint32_t>(body);
      break;
    case MsgType::kRegion: {
      frame.region.id = proto::get_le<std::uint32_t>(body);
      frame.region.flags = proto::get_le<std::uint32_t>(body + 4);
      frame.region.length = proto::get_le<std::uint64_t>(body + 8);
      frame.region.addr = proto::get_le<std::uint64_t>(body + 16);
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
      frame.seq = proto::get_le<std::uint64_t>(body);
      frame.text = std::string_view(reinterpret_cast<const char*>(body) + 8, n - 8);
      break;
    case MsgType::kNotifyAck:
      frame.seq = proto::get_le<std::uint64_t>(body);
      break;
  }
  *out = frame;
  *consumed = kFrameHeaderBytes + n;
  return {};
}

}  // namespace pdr::transfer::shm
