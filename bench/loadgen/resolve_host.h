// pdrouter-bench resolves every host it is given once, before the run: a name that does not
// resolve is then a usage error (exit 2) before any request, and no measured request pays a
// lookup.
#pragma once

#include "proto/base/status.h"
#include "proto/address.h"

namespace pdr::loadgen {

// target->host becomes a numeric address: itself when it is one, else the name's first IPv4
// address (else its first address). kBadAddress when it does not resolve.
Status resolve_host(proto::HostPort* target);

}  // namespace pdr::loadgen
