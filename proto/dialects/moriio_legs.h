// The legs MoRIIO READ and WRITE share (docs/design/wire-formats.md 1.3, 1.4): the same ids and bodies, they
// differ in the order of the legs and in what the decode takes from the prefill's answer
// (moriio_read.cc, moriio_write.cc).
#pragma once

#include "proto/dialects/dialect.h"

namespace pdr::proto::dialects {

Status build_moriio_legs(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill,
                         JsonObjectBody* decode);

}  // namespace pdr::proto::dialects
