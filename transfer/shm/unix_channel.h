// The shm backend's UNIX-socket plumbing: abstract-namespace listen/connect, sending one frame with
// an optional file descriptor (SCM_RIGHTS), and a receive buffer that collects passed fds in order.
// No protocol knowledge (that is shm_wire.h). Linux only.
//
// Addresses: "@name" is the abstract socket `name` (no file system entry, vanishes with its last
// fd, so a crashed process leaves nothing behind).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "proto/base/unique_fd.h"

namespace pdr::transfer::shm {

// A listening, non-blocking, close-on-exec SOCK_STREAM socket on abstract address `address`
// ("@name"). kInvalidValue for an address without '@' or longer than sun_path allows; kIoError with
// the errno text otherwise (e.g. "address in use").
Status listen_unix(std::string_view address, UniqueFd* out);

// Connects (blocking; local and immediate) and returns a non-blocking close-on-exec socket.
Status connect_unix(std::string_view address, UniqueFd* out);

// The pid of the process at the other end (SO_PEERCRED), as seen in our pid namespace.
Status peer_pid(int fd, pid_t* pid);
// The pid and effective uid of the other end (SO_PEERCRED: as they were at connect()/listen()).
Status peer_credentials(int fd, pid_t* pid, uid_t* uid);

// Sends all of `bytes` on a non-blocking stream socket, with `pass_fd` (if >= 0) attached to the
// first byte. Waits for buffer space up to `timeout`. MSG_NOSIGNAL: a hung-up peer is an error
// (kIoError), never SIGPIPE.
Status send_frame(int fd, std::string_view bytes, int pass_fd, std::chrono::milliseconds timeout);

// Bytes and file descriptors received on one stream socket, in arrival order.
class ReceiveBuffer {
 public:
  enum class ReadResult { kData, kWouldBlock, kClosed, kError };

  ReceiveBuffer() = default;
  ReceiveBuffer(const ReceiveBuffer&) = delete;
  ReceiveBuffer& operator=(const ReceiveBuffer&) = delete;
  ~ReceiveBuffer();  // closes fds nobody took

  // One recvmsg() into the buffer. Passed fds arrive close-on-exec and are queued; a truncated
  // control message (MSG_CTRUNC: the peer sent more fds than we accept) is kError.
  ReadResult read_once(int fd);

  std::span<const std::byte> data() const { return {bytes_.data() + start_, bytes_.size() - start_}; }
  void consume(std::size_t n);
  // The oldest received fd not yet taken, or -1 when none arrived. The caller owns it.
  int take_fd();
  std::size_t pending_fds() const { return fds_.size(); }

 private:
  std::vector<std::byte> bytes_;
  std::size_t start_ = 0;
  std::deque<int> fds_;
};

}  // namespace pdr::transfer::shm
