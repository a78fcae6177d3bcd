// RemoteRegion: one of a peer's regions as the initiator reaches it, either mapped from the memfd
// the peer passed (a copy is a plain memcpy, docs/design/kv-transfer.md S-1/S-2) or addressed in the peer process
// by cross-memory attach (process_vm_readv/writev, S-3) when the memory has no fd.
//
// Lifetime: held by shared_ptr. The peer table drops its reference when the peer goes away; a copy
// in progress keeps its own, so the mapping is unmapped only after the last copy using it returns.
//
// Revocation: revoke() makes every later copy() fail kAccess and waits for
// the copies in progress (one chunk each) to return; after it, nothing of ours touches the peer's
// address any more. The peer asks for it (kRegionRevoke) before its unregister_region() returns.
//
// Safety: copy() checks every (offset, length) against the region length it was announced with
// (and, for a memfd, the fd's size was checked at map time), so no copy ever leaves the mapping.
// A peer that shrinks its memfd after we mapped it could still make us fault (SIGBUS); memfds
// sealed with F_SEAL_SHRINK cannot be shrunk, see map_fd().
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "proto/base/status.h"
#include "transfer/core/xfer_types.h"

namespace pdr::transfer::shm {

class RemoteRegion {
 public:
  // Maps `fd` (taken: closed in every case, the mapping keeps the memory) MAP_SHARED read-write.
  // kOutOfRange when the fd is smaller than `length`, kIoError when mmap fails.
  static Status map_fd(std::uint32_t id, std::uint64_t length, int fd,
                       std::shared_ptr<RemoteRegion>* out);
  // A region at `addr` in process `pid`, reached with process_vm_readv/writev.
  static std::shared_ptr<RemoteRegion> attach(std::uint32_t id, std::uint64_t length,
                                              std::uint64_t addr, pid_t pid);

  RemoteRegion(const RemoteRegion&) = delete;
  RemoteRegion& operator=(const RemoteRegion&) = delete;
  ~RemoteRegion();

  std::uint32_t id() const { return id_; }
  std::uint64_t length() const { return length_; }
  bool is_mapped() const { return base_ != nullptr; }

  // Checks [offset, offset + length) against the region (overflow safe).
  bool contains(std::uint64_t offset, std::uint64_t length) const {
    return offset <= length_ && length <= length_ - offset;
  }

  // READ copies remote -> local, WRITE local -> remote. Returns kNone on success, otherwise the
  // cause with a reason in *error: kAccess for an out-of-range span or a refused cross-memory attach
  // (EPERM: ptrace permission, see ShmBackendOptions::allow_cma), kPeerGone when the process is
  // gone (ESRCH), kInternal otherwise.
  XferCause copy(XferOp op, std::uint64_t offset, std::byte* local, std::uint64_t length,
                 std::string* error) const;

  // Thread-safe; idempotent.
  void revoke();

 private:
  RemoteRegion(std::uint32_t id, std::uint64_t length) : id_(id), length_(length) {}
  XferCause copy_unchecked(XferOp op, std::uint64_t offset, std::byte* local, std::uint64_t length,
                           std::string* error) const;

  std::uint32_t id_;
  std::uint64_t length_;
  std::byte* base_ = nullptr;  // the mapping, or null for cross-memory attach
  std::uint64_t addr_ = 0;     // cross-memory attach: address in the peer
  pid_t pid_ = 0;

  mutable std::mutex mu_;
  mutable std::condition_variable idle_;  // copies_ reached 0
  mutable std::uint32_t copies_ = 0;      // copy() calls in progress (cross-memory attach only)
  bool revoked_ = false;
};

}  // namespace pdr::transfer::shm
