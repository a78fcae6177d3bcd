#include "transfer/tcp/frame_io.h"

#include <sys/socket.h>

#include <cerrno>

namespace pdr::transfer::tcp {

HeaderBytes make_header(proto::FrameOpcode opcode, std::uint32_t flags, std::uint64_t xfer_id,
                        std::uint32_t region_id, std::uint64_t offset, std::uint64_t length) {
  proto::TransferFrameHeader header;
  header.opcode = opcode;
  header.flags = flags;
  header.xfer_id = xfer_id;
  header.region_id = region_id;
  header.offset = offset;
  header.length = length;
  HeaderBytes bytes;
  proto::encode_frame_header(header, bytes);
  return bytes;
}

ssize_t send_vectors(int fd, iovec* vectors, int count) {
  msghdr message{};
  message.msg_iov = vectors;
  message.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    const ssize_t sent = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (sent >= 0) return sent;
    if (errno != EINTR) return -errno;
  }
}

ssize_t receive_some(int fd, void* into, std::size_t bytes) {
  for (;;) {
    const ssize_t got = ::recv(fd, into, bytes, 0);
    if (got >= 0) return got;
    if (errno != EINTR) return -errno;
  }
}

const std::byte* zero_block() {
  static const std::byte zeros[kZeroBlockBytes] = {};
  return zeros;
}

}  // namespace pdr::transfer::tcp
