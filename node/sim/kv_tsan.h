// Under ThreadSanitizer: a scope in which this thread's reads and writes are not tracked, for the
// sim's own accesses to KV payload memory (filling a prefill's blocks, verifying a decode's).
//
// Why: that memory is also read and written by the transfer backend's I/O threads, and what orders
// those accesses with ours is the transfer protocol's round trip through the network and the peer
// (tests/tsan.supp explains the same for the tcp backend's syscall wrappers). TSan cannot see it,
// so every 8-byte word of a reused block would be reported (and suppressed) one by one, which
// under TSan takes minutes per request. Only payload bytes are hidden; the mover's bookkeeping
// stays instrumented. No-op in other builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define PDR_SIM_KV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define PDR_SIM_KV_TSAN 1
#endif
#endif

#ifdef PDR_SIM_KV_TSAN
extern "C" {
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#endif

namespace pdr::node::sim {

class IgnoreKvPayloadAccesses {
 public:
#ifdef PDR_SIM_KV_TSAN
  IgnoreKvPayloadAccesses() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreKvPayloadAccesses() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#else
  // User-provided, so a scope guard variable is not "unused" to the compiler.
  IgnoreKvPayloadAccesses() {}
  ~IgnoreKvPayloadAccesses() {}
#endif
  IgnoreKvPayloadAccesses(const IgnoreKvPayloadAccesses&) = delete;
  IgnoreKvPayloadAccesses& operator=(const IgnoreKvPayloadAccesses&) = delete;
};

}  // namespace pdr::node::sim
