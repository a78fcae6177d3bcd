#include "transfer/shm/unix_channel.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include "transfer/net/blocking_socket.h"

namespace pdr::transfer::shm {
namespace {

Status errno_status(std::string_view what, int err) {
  return Status(StatusCode::kIoError, std::string(what) + ": " + std::strerror(err));
}

Status make_address(std::string_view address, sockaddr_un* addr, socklen_t* len) {
  // The abstract name is everything after '@'; sun_path[0] == '\0' selects the abstract namespace.
  if (address.size() < 2 || address[0] != '@') {
    return Status(StatusCode::kInvalidValue,
                  "shm address '" + std::string(address) + "' is not an abstract socket ('@name')");
  }
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  if (address.size() > sizeof(addr->sun_path)) {
    return Status(StatusCode::kInvalidValue, "shm address '" + std::string(address) + "' is longer than " +
                                                 std::to_string(sizeof(addr->sun_path)) + " bytes");
  }
  std::memcpy(addr->sun_path + 1, address.data() + 1, address.size() - 1);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  return {};
}

}  // namespace

Status listen_unix(std::string_view address, UniqueFd* out) {
  sockaddr_un addr;
  socklen_t len = 0;
  if (Status s = make_address(address, &addr, &len); !s) return s;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return errno_status("shm socket()", errno);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    return errno_status("shm bind " + std::string(address), errno);
  }
  if (::listen(fd.get(), 128) != 0) return errno_status("shm listen", errno);
  *out = std::move(fd);
  return {};
}

Status connect_unix(std::string_view address, UniqueFd* out) {
  sockaddr_un addr;
  socklen_t len = 0;
  if (Status s = make_address(address, &addr, &len); !s) return s;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return errno_status("shm socket()", errno);
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) return errno_status("shm connect " + std::string(address), errno);
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return errno_status("shm fcntl", errno);
  }
  *out = std::move(fd);
  return {};
}

Status peer_credentials(int fd, pid_t* pid, uid_t* uid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status("shm SO_PEERCRED", errno);
  }
  *pid = cred.pid;
  *uid = cred.uid;
  return {};
}

Status peer_pid(int fd, pid_t* pid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return errno_status("shm SO_PEERCRED", errno);
  }
  *pid = cred.pid;
  return {};
}

Status send_frame(int fd, std::string_view bytes, int pass_fd, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::size_t sent = 0;
  bool fd_sent = pass_fd < 0;
  while (sent < bytes.size()) {
    iovec iov{const_cast<char*>(bytes.data() + sent), bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (!fd_sent) {
      std::memset(control, 0, sizeof(control));
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
      cmsg->cmsg_level = SOL_SOCKET;
      cmsg->cmsg_type = SCM_RIGHTS;
      cmsg->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(cmsg), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      fd_sent = true;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Status s = wait_socket(fd, POLLOUT, deadline, "shm send: peer not reading"); !s) return s;
      continue;
    }
    return errno_status("shm send", n < 0 ? errno : EPIPE);
  }
  return {};
}

ReceiveBuffer::~ReceiveBuffer() {
  for (int fd : fds_) ::close(fd);
}

ReceiveBuffer::ReadResult ReceiveBuffer::read_once(int fd) {
  if (start_ > 0 && start_ == bytes_.size()) {
    bytes_.clear();
    start_ = 0;
  } else if (start_ > 64 * 1024) {
    bytes_.erase(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  constexpr std::size_t kChunk = 16 * 1024;
  const std::size_t old = bytes_.size();
  bytes_.resize(old + kChunk);
  iovec iov{bytes_.data() + old, kChunk};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a handful of fds: a well-behaved peer attaches at most one per frame, and Linux does
  // not merge stream segments that carry fds into one read.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  bytes_.resize(old + (n > 0 ? static_cast<std::size_t>(n) : 0));
  if (n < 0) {
    return errno == EAGAIN || errno == EWOULDBLOCK ? ReadResult::kWouldBlock : ReadResult::kError;
  }
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int passed;
      std::memcpy(&passed, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
      fds_.push_back(passed);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0) return ReadResult::kError;
  if (n == 0) return ReadResult::kClosed;
  return ReadResult::kData;
}

void ReceiveBuffer::consume(std::size_t n) { start_ += n; }

int ReceiveBuffer::take_fd() {
  if (fds_.empty()) return -1;
  const int fd = fds_.front();
  fds_.pop_front();
  return fd;
}

}  // namespace pdr::transfer::shm
