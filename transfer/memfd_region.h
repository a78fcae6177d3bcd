// MemfdRegion: zeroed, page-aligned host memory backed by a memfd, mapped MAP_SHARED, so the shm
// backend can hand the fd to a same-host peer (SCM_RIGHTS) which maps the very same pages
// (docs/design/kv-transfer.md S-1). The file is sealed at its length (F_SEAL_SHRINK | F_SEAL_GROW), so a peer's
// mapping of it can never fault. Move-only owner of the fd and the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/base/status.h"

namespace pdr::transfer {

class MemfdRegion {
 public:
  MemfdRegion() = default;
  MemfdRegion(MemfdRegion&& other) noexcept;
  MemfdRegion& operator=(MemfdRegion&& other) noexcept;
  MemfdRegion(const MemfdRegion&) = delete;
  MemfdRegion& operator=(const MemfdRegion&) = delete;
  ~MemfdRegion();

  // kInvalidValue for length 0; kIoError naming the failing call (memfd_create, ftruncate, mmap).
  // `name` only labels the memfd in /proc/<pid>/fd.
  static Status create(std::uint64_t length, const std::string& name, MemfdRegion* out);

  int fd() const { return fd_; }
  std::byte* data() const { return data_; }
  std::uint64_t length() const { return length_; }

 private:
  void reset();

  int fd_ = -1;
  std::byte* data_ = nullptr;
  std::uint64_t length_ = 0;
};

}  // namespace pdr::transfer
