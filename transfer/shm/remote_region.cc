#include "transfer/shm/remote_region.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

#include "transfer/shm/unix_channel.h"

namespace pdr::transfer::shm {

Status RemoteRegion::map_fd(std::uint32_t id, std::uint64_t length, int fd,
                            std::shared_ptr<RemoteRegion>* out) {
  UniqueFd owned(fd);
  struct stat st{};
  if (::fstat(owned.get(), &st) != 0) {
    return Status(StatusCode::kIoError, std::string("shm fstat: ") + std::strerror(errno));
  }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < length) {
    return Status(StatusCode::kOutOfRange, "shm region " + std::to_string(id) + " announces " +
                                               std::to_string(length) + " bytes, its fd has " +
                                               std::to_string(st.st_size));
  }
  void* base = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, owned.get(), 0);
  if (base == MAP_FAILED) {
    return Status(StatusCode::kIoError, std::string("shm mmap: ") + std::strerror(errno));
  }
  std::shared_ptr<RemoteRegion> region(new RemoteRegion(id, length));
  region->base_ = static_cast<std::byte*>(base);
  *out = std::move(region);
  return {};
}

std::shared_ptr<RemoteRegion> RemoteRegion::attach(std::uint32_t id, std::uint64_t length,
                                                   std::uint64_t addr, pid_t pid) {
  std::shared_ptr<RemoteRegion> region(new RemoteRegion(id, length));
  region->addr_ = addr;
  region->pid_ = pid;
  return region;
}

RemoteRegion::~RemoteRegion() {
  if (base_ != nullptr) ::munmap(base_, length_);
}

XferCause RemoteRegion::copy(XferOp op, std::uint64_t offset, std::byte* local,
                             std::uint64_t length, std::string* error) const {
  if (!contains(offset, length)) {
    *error = "span " + std::to_string(offset) + "+" + std::to_string(length) +
             " leaves remote region " + std::to_string(id_) + " of " + std::to_string(length_) +
             " bytes";
    return XferCause::kAccess;
  }
  if (length == 0) return XferCause::kNone;
  {
    std::lock_guard lock(mu_);
    if (revoked_) {
      *error = "remote region " + std::to_string(id_) + " was unregistered by its owner";
      return XferCause::kAccess;
    }
    ++copies_;
  }
  const XferCause cause = copy_unchecked(op, offset, local, length, error);
  {
    std::lock_guard lock(mu_);
    if (--copies_ == 0) idle_.notify_all();
  }
  return cause;
}

void RemoteRegion::revoke() {
  std::unique_lock lock(mu_);
  revoked_ = true;
  idle_.wait(lock, [&] { return copies_ == 0; });
}

XferCause RemoteRegion::copy_unchecked(XferOp op, std::uint64_t offset, std::byte* local,
                                       std::uint64_t length, std::string* error) const {
  if (base_ != nullptr) {
    if (op == XferOp::kRead) {
      std::memcpy(local, base_ + offset, length);
    } else {
      std::memcpy(base_ + offset, local, length);
    }
    return XferCause::kNone;
  }
  std::uint64_t done = 0;
  while (done < length) {
    iovec local_iov{local + done, static_cast<std::size_t>(length - done)};
    iovec remote_iov{reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr_ + offset + done)),
                     static_cast<std::size_t>(length - done)};
    const ssize_t n = op == XferOp::kRead
                          ? ::process_vm_readv(pid_, &local_iov, 1, &remote_iov, 1, 0)
                          : ::process_vm_writev(pid_, &local_iov, 1, &remote_iov, 1, 0);
    if (n > 0) {
      done += static_cast<std::uint64_t>(n);
      continue;
    }
    const int err = n < 0 ? errno : EFAULT;
    if (err == EINTR) continue;
    if (err == EPERM) {
      *error =
          "cross-memory attach to pid " + std::to_string(pid_) +
          " refused (EPERM): the peer must allow ptrace by us (its shm backend names one peer pid "
          "with PR_SET_PTRACER for Yama ptrace_scope=1; scope 2/3 or a seccomp/capability policy "
          "forbids it): register memfd-backed memory instead";
      return XferCause::kAccess;
    }
    if (err == ESRCH) {
      *error = "peer process " + std::to_string(pid_) + " is gone";
      return XferCause::kPeerGone;
    }
    if (err == EFAULT) {
      *error = "cross-memory attach: remote region " + std::to_string(id_) + " is not mapped";
      return XferCause::kAccess;
    }
    *error = std::string("cross-memory attach: ") + std::strerror(err);
    return XferCause::kInternal;
  }
  return XferCause::kNone;
}

}  // namespace pdr::transfer::shm
