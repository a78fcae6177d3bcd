// Non-blocking frame I/O helpers shared by both connection roles: header building over
// proto/transfer_frame.h and the two syscalls (sendmsg with MSG_NOSIGNAL, recv) with errno mapped
// to a negative return, so callers branch on -EAGAIN without touching errno.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "proto/transfer_frame.h"

namespace pdr::transfer::tcp {

using HeaderBytes = std::array<std::byte, proto::kTransferFrameHeaderBytes>;

// Flag bits of this backend (the frame codec carries flags verbatim).
// WRITE: the last frame of a lane's batch; the server answers it with one ACK (or ERROR) covering
// every WRITE of that xfer_id since the previous flagged one (T-2 cumulative ACKs).
inline constexpr std::uint32_t kFlagAckRequested = 1u << 0;
// ERROR frames carry the XferCause in the low 8 bits of flags.

HeaderBytes make_header(proto::FrameOpcode opcode, std::uint32_t flags, std::uint64_t xfer_id,
                        std::uint32_t region_id, std::uint64_t offset, std::uint64_t length);

// Bytes sent, or -errno (-EAGAIN when the socket buffer is full). Never raises SIGPIPE.
ssize_t send_vectors(int fd, iovec* vectors, int count);
// Bytes received, 0 on orderly shutdown, or -errno.
ssize_t receive_some(int fd, void* into, std::size_t bytes);

// A read-only block of zeros: what a frame already half on the wire is finished with once its task
// settled (the stream must stay in sync, the task's memory must not be read any more).
const std::byte* zero_block();
inline constexpr std::size_t kZeroBlockBytes = 64 * 1024;

}  // namespace pdr::transfer::tcp
