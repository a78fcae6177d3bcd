// MoRIIO WRITE (docs/design/wire-formats.md 1.3 step 7, rule 8): concurrent; the prefill pushes the
// blocks to the decode its request id names, so the decode needs nothing from the prefill's
// answer and a failed decode needs a whole new pair.
#include "proto/dialects/dialect.h"
#include "proto/dialects/moriio_legs.h"

namespace pdr::proto {
extern const Dialect kMoriioWriteDialect;
const Dialect kMoriioWriteDialect{
    .name = "moriio-write",
    .connector = Connector::kMoriio,
    .transfer_mode = TransferMode::kWrite,
    .concurrent = true,
    .decode_needs_prefill_params = false,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kMoriio,
    .prefill_bootstrap_port_default = false,
    .build = &dialects::build_moriio_legs,
    .finish_decode = nullptr,
    .without_kv = nullptr,
};
}  // namespace pdr::proto
