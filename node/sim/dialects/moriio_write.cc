// MoRIIO WRITE (docs/design/wire-formats.md 1): the prefill WRITEs into the decode's blocks, so the
// decode needs no remote_block_ids. The rest is shared with MoRIIO READ (moriio.h).
#include "node/sim/dialects/moriio.h"

namespace pdr::node::sim {

extern const SimDialect kMoriioWriteSimDialect;
const SimDialect kMoriioWriteSimDialect{
    .name = "moriio-write",
    .connector = proto::Connector::kMoriio,
    .transfer_mode = proto::TransferMode::kWrite,
    .default_kv_port = 5600,  // unused: MoRIIO's side channel is its handshake/notify ports
    .movement = KvMovement::kPush,
    .leg_from_role = false,
    .check_leg = dialect::moriio_check_leg,
    .prefill_answer = dialect::moriio_prefill_answer,
    .side_channel = dialect::moriio_side_channel,
    .resolve_peer = dialect::moriio_resolve_peer,
    .fill_registration = dialect::moriio_registration,
    .bootstrap_query = nullptr,
};

}  // namespace pdr::node::sim
