#include "transfer/shm/cma_grant.h"

#include <sys/prctl.h>

namespace pdr::transfer::shm {

CmaGrant::~CmaGrant() {
  if (holds_ > 0) ::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
}

bool CmaGrant::acquire(pid_t pid) {
  if (pid <= 0) return false;
  if (holds_ > 0 && holder_ != pid) return false;
  if (holds_ == 0) {
    // Fails harmlessly (EINVAL) without Yama; then nothing else restricts same-uid attach anyway.
    ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(pid), 0, 0, 0);
    holder_ = pid;
  }
  ++holds_;
  return true;
}

void CmaGrant::release(pid_t pid) {
  if (holds_ == 0 || pid != holder_) return;
  if (--holds_ == 0) {
    ::prctl(PR_SET_PTRACER, 0, 0, 0, 0);
    holder_ = 0;
  }
}

}  // namespace pdr::transfer::shm
