#include "proto/base/keyed_hash.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace pdr {

namespace {

constexpr uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline void sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

// 16 bytes from the kernel: getrandom(2), or /dev/urandom where a seccomp filter or an old
// kernel refuses the system call (ENOSYS).
bool kernel_random(unsigned char* out, size_t size) {
  size_t have = 0;
  while (have < size) {
    // Blocks only until the kernel's pool is first initialised (early boot), never afterwards.
    const ssize_t n = getrandom(out + have, size - have, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    have += static_cast<size_t>(n);
  }
  if (have == size) return true;
  std::FILE* f = std::fopen("/dev/urandom", "rb");
  if (f == nullptr) return false;
  const bool ok = std::fread(out, 1, size, f) == size;
  std::fclose(f);
  return ok;
}

SipKey draw_key() {
  unsigned char bytes[16];
  if (!kernel_random(bytes, sizeof bytes)) {
    std::fprintf(stderr, "pdrouter: no random bytes from getrandom or /dev/urandom (%s): no secret for the keyed hash\n",
                 std::strerror(errno));
    std::abort();
  }
  SipKey key;
  std::memcpy(&key.k0, bytes, 8);
  std::memcpy(&key.k1, bytes + 8, 8);
  return key;
}

}  // namespace

uint64_t siphash24_u64(uint64_t value, const SipKey& key) noexcept {
  uint64_t v0 = key.k0 ^ 0x736f6d6570736575ULL;
  uint64_t v1 = key.k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = key.k0 ^ 0x6c7967656e657261ULL;
  uint64_t v3 = key.k1 ^ 0x7465646279746573ULL;
  // The one message block is `value` itself: the reference reads its 8 bytes little-endian.
  v3 ^= value;
  sip_round(v0, v1, v2, v3);
  sip_round(v0, v1, v2, v3);
  v0 ^= value;
  // The final block: the message length (8) in the top byte, no trailing bytes.
  constexpr uint64_t kLengthBlock = uint64_t{8} << 56;
  v3 ^= kLengthBlock;
  sip_round(v0, v1, v2, v3);
  sip_round(v0, v1, v2, v3);
  v0 ^= kLengthBlock;
  v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) sip_round(v0, v1, v2, v3);
  return v0 ^ v1 ^ v2 ^ v3;
}

const SipKey& process_hash_key() {
  static const SipKey key = draw_key();
  return key;
}

}  // namespace pdr
