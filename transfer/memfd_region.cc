#include "transfer/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace pdr::transfer {

namespace {
Status io_error(const char* call) {
  return Status(StatusCode::kIoError, std::string(call) + ": " + std::strerror(errno));
}
}  // namespace

MemfdRegion::MemfdRegion(MemfdRegion&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      data_(std::exchange(other.data_, nullptr)),
      length_(std::exchange(other.length_, 0)) {}

MemfdRegion& MemfdRegion::operator=(MemfdRegion&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    length_ = std::exchange(other.length_, 0);
  }
  return *this;
}

MemfdRegion::~MemfdRegion() { reset(); }

void MemfdRegion::reset() {
  if (data_ != nullptr) ::munmap(data_, length_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  data_ = nullptr;
  length_ = 0;
}

Status MemfdRegion::create(std::uint64_t length, const std::string& name, MemfdRegion* out) {
  if (length == 0) return Status(StatusCode::kInvalidValue, "region length must be at least 1");
  MemfdRegion region;
  region.fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (region.fd_ < 0) return io_error("memfd_create");
  if (::ftruncate(region.fd_, static_cast<off_t>(length)) != 0) return io_error("ftruncate");
  // Sealed at its size: a peer that maps our fd can then trust the length (nobody can shrink the
  // file under its mapping and turn its next access into SIGBUS), and neither can we.
  if (::fcntl(region.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return io_error("fcntl(F_ADD_SEALS)");
  }
  void* data = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, region.fd_, 0);
  if (data == MAP_FAILED) return io_error("mmap");
  region.data_ = static_cast<std::byte*>(data);
  region.length_ = length;
  *out = std::move(region);
  return Status::ok();
}

}  // namespace pdr::transfer
