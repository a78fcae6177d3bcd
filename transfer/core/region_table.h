// RegionTable: the registered memory regions of one engine, addressed by a small RegionId.
//
// Peers never name raw virtual addresses: every remote request carries (RegionId, offset, length)
// and resolve() bounds-checks it in O(1) before any byte moves (docs/design/kv-transfer.md T-3 and
// "Regions": a peer can never touch memory outside what was registered).
//
// RegionId: a u32 (it travels in the 32-byte frame header as region_id). The low 16 bits are the
// slot index (dense, lowest free slot first, so ids stay small); the high 16 bits are the slot's
// generation, bumped on every unregister. A peer holding a stale id of an unregistered region gets
// kNotFound instead of reaching whatever region reused the slot. Generation 0 is never issued, so
// 0 is never a valid id (kInvalidRegion).
//
// Threads: register_region() and unregister_region() may be called from any thread; they
// serialise on an internal mutex (registration is rare: once per KV pool at start-up). resolve(),
// lookup() and size() never block and never allocate on success: they read a per-slot seqlock, so
// the I/O threads that resolve every incoming frame neither contend with each other nor with
// registration (a shared_mutex would bounce its reader count between cores on every frame).
//
// Lifetime: the table never owns the memory. Unregistering a region stops *new* resolves and pins.
// A pointer returned by resolve() is not protected: resolve() is for memory whose users the engine
// tracks itself (its own submitted transfers, counted per region). The serving side of a backend,
// which touches memory on a remote peer's behalf, uses pin() instead (so an unregistered region is never touched):
//   - pin() resolves like resolve() and holds the region until unpin(); unregister_region() first
//     makes the region unresolvable ("dead": new resolves and pins fail kNotFound), then waits
//     until every pin taken before is released, and only then returns. Once it returned, no serving
//     operation touches the region again, so the caller may free the memory.
//   - A pin is held only around one bounded step that touches the memory (one non-blocking recv or
//     send, one memcpy), never across waiting for a peer: the serving side pins again before each
//     step of a long frame and, when the pin fails (the region was unregistered meanwhile), drains
//     the rest of the frame into scratch (WRITE) or stops sending from it (READ). This keeps
//     unregister_region()'s wait short without a timeout, even against a peer that stalls half way
//     through a frame.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::transfer {

using RegionId = std::uint32_t;
inline constexpr RegionId kInvalidRegion = 0;

// Where the memory lives. Only host kinds are usable by the TCP and SHM backends; device memory
// needs a backend that can reach it (RDMA with GPUDirect), which checks the kind itself.
enum class MemKind : std::uint8_t {
  kHostDram = 0,  // ordinary process memory
  kHostShared,    // host memory backed by a shareable fd (memfd), see docs/design/kv-transfer.md S-1
  kDevice,        // accelerator memory (opaque address, never dereferenced by the core)
};
std::string_view mem_kind_label(MemKind kind);

struct Region {
  std::uintptr_t addr = 0;
  std::uint64_t length = 0;
  MemKind kind = MemKind::kHostDram;
};

class RegionTable {
 public:
  static constexpr std::size_t kMaxCapacity = 1u << 16;  // slot index must fit the low 16 bits
  static constexpr std::size_t kDefaultCapacity = 1024;

  // capacity is clamped to [1, kMaxCapacity]. All slots are allocated up front.
  explicit RegionTable(std::size_t capacity = kDefaultCapacity);
  RegionTable(const RegionTable&) = delete;
  RegionTable& operator=(const RegionTable&) = delete;
  ~RegionTable();

  // Registers [addr, addr + length). Fails with kInvalidValue for a null address, zero length or a
  // range that wraps the address space, and kRejected when every slot is in use. Overlapping
  // registrations are allowed (a pool may be exposed twice with different kinds).
  Status register_region(const void* addr, std::uint64_t length, MemKind kind, RegionId* id);

  // kNotFound for an id that is not currently registered (never issued, or already unregistered).
  // Waits for the region's pins to be released (see Lifetime above) before returning ok.
  Status unregister_region(RegionId id);

  // Bounds-checks [offset, offset + length) against the region and returns its address. Overflow
  // safe for any offset/length (offset = UINT64_MAX included). A zero length at offset <= region
  // length is accepted. kNotFound for an unknown or stale id, kOutOfRange when the span leaves the
  // region.
  Status resolve(RegionId id, std::uint64_t offset, std::uint64_t length, std::byte** out) const;

  // resolve() that also pins the region until unpin(id) (exactly once per successful pin; the
  // same id). Never blocks. On error nothing is pinned.
  Status pin(RegionId id, std::uint64_t offset, std::uint64_t length, std::byte** out) const;
  void unpin(RegionId id) const;

  // A consistent snapshot of a registered region, or nullopt.
  std::optional<Region> lookup(RegionId id) const;

  std::size_t capacity() const { return capacity_; }
  std::size_t size() const { return live_.load(std::memory_order_relaxed); }

 private:
  struct Slot;
  // Reads slot `index` under its seqlock; false if the slot is not registered as `id`.
  bool read_slot(RegionId id, Region* region) const;

  std::size_t capacity_;
  std::unique_ptr<Slot[]> slots_;
  std::mutex write_mu_;  // serialises writers; readers never take it
  std::atomic<std::size_t> live_{0};
};

}  // namespace pdr::transfer
