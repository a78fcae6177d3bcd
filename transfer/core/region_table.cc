#include "transfer/core/region_table.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

namespace pdr::transfer {

namespace {
constexpr std::uint32_t kIndexBits = 16;
constexpr std::uint32_t kIndexMask = (1u << kIndexBits) - 1;

std::uint32_t slot_index(RegionId id) { return id & kIndexMask; }
RegionId make_id(std::uint32_t index, std::uint16_t generation) {
  return (static_cast<RegionId>(generation) << kIndexBits) | index;
}
}  // namespace

std::string_view mem_kind_label(MemKind kind) {
  switch (kind) {
    case MemKind::kHostDram: return "host_dram";
    case MemKind::kHostShared: return "host_shared";
    case MemKind::kDevice: return "device";
  }
  return "unknown";
}

// A seqlock per slot (Boehm, "Can seqlocks get along with programming language memory models?",
// 2012), in its fence-free form: every field is an atomic written with release and read with
// acquire (both plain moves on x86). A reader that sees any field value of an update synchronises
// with that store, which follows the update's odd sequence store, so its second sequence read sees
// the sequence moved and it retries. Readers racing a writer are thus defined behaviour, and TSan
// (which GCC does not let see std::atomic_thread_fence) understands it. Writers hold the odd
// sequence for a few stores only.
struct RegionTable::Slot {
  std::atomic<std::uint32_t> seq{0};
  std::atomic<RegionId> id{kInvalidRegion};  // kInvalidRegion while free
  std::atomic<std::uint64_t> addr{0};
  std::atomic<std::uint64_t> length{0};
  std::atomic<std::uint8_t> kind{0};
  std::uint16_t generation = 0;  // writer-only (under write_mu_); last generation issued
  // Serving pins (pin()/unpin()). Dekker-style with unregister: pin() increments, then re-reads
  // the id; unregister stores the dead id, then reads the count; all seq_cst, so at least one of
  // them sees the other (the pin fails, or unregister waits for it).
  mutable std::atomic<std::uint32_t> pins{0};
};

RegionTable::RegionTable(std::size_t capacity)
    : capacity_(std::clamp<std::size_t>(capacity, 1, kMaxCapacity)),
      slots_(std::make_unique<Slot[]>(capacity_)) {}

RegionTable::~RegionTable() = default;

Status RegionTable::register_region(const void* addr, std::uint64_t length, MemKind kind,
                                   RegionId* id) {
  auto base = reinterpret_cast<std::uintptr_t>(addr);
  if (base == 0) return Status(StatusCode::kInvalidValue, "region address is null");
  if (length == 0) return Status(StatusCode::kInvalidValue, "region length is 0");
  if (length - 1 > UINTPTR_MAX - base) {
    return Status(StatusCode::kInvalidValue, "region [addr, addr+length) wraps the address space");
  }
  std::lock_guard lock(write_mu_);
  for (std::uint32_t i = 0; i < capacity_; ++i) {
    Slot& slot = slots_[i];
    if (slot.id.load(std::memory_order_relaxed) != kInvalidRegion) continue;
    // Skip generation 0 so that id 0 (index 0, generation 0) is never issued.
    std::uint16_t generation = static_cast<std::uint16_t>(slot.generation + 1);
    if (generation == 0) generation = 1;
    slot.generation = generation;
    const RegionId new_id = make_id(i, generation);
    const std::uint32_t seq = slot.seq.load(std::memory_order_relaxed);
    slot.seq.store(seq + 1, std::memory_order_relaxed);
    slot.addr.store(base, std::memory_order_release);
    slot.length.store(length, std::memory_order_release);
    slot.kind.store(static_cast<std::uint8_t>(kind), std::memory_order_release);
    slot.id.store(new_id, std::memory_order_release);
    slot.seq.store(seq + 2, std::memory_order_release);
    live_.fetch_add(1, std::memory_order_relaxed);
    *id = new_id;
    return Status::ok();
  }
  return Status(StatusCode::kRejected,
                "region table full (" + std::to_string(capacity_) + " regions)");
}

Status RegionTable::unregister_region(RegionId id) {
  const std::uint32_t index = slot_index(id);
  std::lock_guard lock(write_mu_);
  if (id == kInvalidRegion || index >= capacity_ ||
      slots_[index].id.load(std::memory_order_relaxed) != id) {
    return Status(StatusCode::kNotFound, "region " + std::to_string(id) + " is not registered");
  }
  Slot& slot = slots_[index];
  const std::uint32_t seq = slot.seq.load(std::memory_order_relaxed);
  slot.seq.store(seq + 1, std::memory_order_relaxed);
  slot.id.store(kInvalidRegion, std::memory_order_seq_cst);  // seq_cst: see Slot::pins
  slot.addr.store(0, std::memory_order_release);
  slot.length.store(0, std::memory_order_release);
  slot.seq.store(seq + 2, std::memory_order_release);
  live_.fetch_sub(1, std::memory_order_relaxed);
  // The region is dead for new pins; wait out the pins taken before. Each is held for one
  // non-blocking step (header contract), so this is short; write_mu_ stays held so that the slot
  // cannot be reused (and pinned under its new id) while we wait.
  for (unsigned spins = 0; slot.pins.load(std::memory_order_seq_cst) != 0; ++spins) {
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return Status::ok();
}

bool RegionTable::read_slot(RegionId id, Region* region) const {
  const std::uint32_t index = slot_index(id);
  if (id == kInvalidRegion || index >= capacity_) return false;
  const Slot& slot = slots_[index];
  for (;;) {
    const std::uint32_t before = slot.seq.load(std::memory_order_acquire);
    if (before & 1u) continue;  // a writer is mid-update; it holds the odd value for a few stores
    const RegionId current = slot.id.load(std::memory_order_acquire);
    region->addr = slot.addr.load(std::memory_order_acquire);
    region->length = slot.length.load(std::memory_order_acquire);
    region->kind = static_cast<MemKind>(slot.kind.load(std::memory_order_acquire));
    if (slot.seq.load(std::memory_order_relaxed) == before) return current == id;
  }
}

std::optional<Region> RegionTable::lookup(RegionId id) const {
  Region region;
  if (!read_slot(id, &region)) return std::nullopt;
  return region;
}

Status RegionTable::resolve(RegionId id, std::uint64_t offset, std::uint64_t length,
                            std::byte** out) const {
  Region region;
  if (!read_slot(id, &region)) {
    return Status(StatusCode::kNotFound, "region " + std::to_string(id) + " is not registered");
  }
  // offset <= len && length <= len - offset: neither side can overflow.
  if (offset > region.length || length > region.length - offset) {
    return Status(StatusCode::kOutOfRange,
                  "span offset " + std::to_string(offset) + " length " + std::to_string(length) +
                      " leaves region " + std::to_string(id) + " of " +
                      std::to_string(region.length) + " bytes");
  }
  *out = reinterpret_cast<std::byte*>(region.addr + offset);
  return Status::ok();
}

Status RegionTable::pin(RegionId id, std::uint64_t offset, std::uint64_t length,
                        std::byte** out) const {
  const std::uint32_t index = slot_index(id);
  if (id == kInvalidRegion || index >= capacity_) {
    return Status(StatusCode::kNotFound, "region " + std::to_string(id) + " is not registered");
  }
  const Slot& slot = slots_[index];
  slot.pins.fetch_add(1, std::memory_order_seq_cst);
  Status status = resolve(id, offset, length, out);
  // The seq_cst re-read pairs with unregister's seq_cst store of the dead id (Slot::pins).
  if (status.is_ok() && slot.id.load(std::memory_order_seq_cst) != id) {
    status = Status(StatusCode::kNotFound, "region " + std::to_string(id) + " is not registered");
  }
  if (!status.is_ok()) slot.pins.fetch_sub(1, std::memory_order_release);
  return status;
}

void RegionTable::unpin(RegionId id) const {
  const std::uint32_t index = slot_index(id);
  if (id == kInvalidRegion || index >= capacity_) return;
  slots_[index].pins.fetch_sub(1, std::memory_order_release);
}

}  // namespace pdr::transfer
