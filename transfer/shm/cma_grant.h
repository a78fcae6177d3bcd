// CmaGrant: who may attach to this process by cross-memory attach (process_vm_readv/writev), the
// scoped replacement of the process-wide prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) (so only
// the peers this backend serves may attach).
//
// Under Yama ptrace_scope=1 a peer may attach to us only if we name it with PR_SET_PTRACER, and the
// kernel keeps exactly one such pid per process. So CMA is granted to one peer process at a time:
// the first serving connection that needs it (an fd-less region is about to be announced by
// address) claims the grant for its SO_PEERCRED pid; further connections from that pid share it;
// a connection from another pid is refused CMA (its fd-less regions are not announced, so its
// transfers to them fail kAccess; memfd regions are unaffected). When the last connection holding
// the grant closes, the exception is cleared (PR_SET_PTRACER 0) and the next peer may claim it.
// Where Yama is absent prctl fails EINVAL and only the bookkeeping remains (same uid attaches
// anyway; other uids never get this far, see ShmBackendOptions::allowed_uids).
//
// Threads: the shm backend's I/O thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace pdr::transfer::shm {

class CmaGrant {
 public:
  CmaGrant() = default;
  CmaGrant(const CmaGrant&) = delete;
  CmaGrant& operator=(const CmaGrant&) = delete;
  ~CmaGrant();  // clears the exception if still held

  // True when `pid` holds (now or already) the grant; each true must be matched by one release().
  bool acquire(pid_t pid);
  void release(pid_t pid);

  pid_t holder() const { return holder_; }

 private:
  pid_t holder_ = 0;
  std::uint32_t holds_ = 0;
};

}  // namespace pdr::transfer::shm
