// The host identity a descriptor carries for same-host detection (docs/design/kv-transfer.md S-5): two engines are
// on the same host when both the hostname and the kernel boot id match. The boot id changes on every
// boot, so a recycled hostname on another machine (or a container image cloned across hosts) does
// not pass as local; it stays equal across containers sharing a kernel, which is exactly when
// shared memory and cross-memory attach work.
#pragma once

#include <string>

namespace pdr::transfer {

// gethostname(), or "" when it fails.
std::string local_hostname();
// /proc/sys/kernel/random/boot_id without the trailing newline, or "" when unreadable.
std::string local_boot_id();

}  // namespace pdr::transfer
