// The simulator's dialects (node/sim/dialect.h), one file each in this folder. Adding a dialect:
// its file, its declaration and its line below. The order is --connector's help order; a
// connector with transfer modes lists its default mode first.
#include "node/sim/dialect.h"

namespace pdr::node::sim {

extern const SimDialect kNixlSimDialect;         // nixl.cc
extern const SimDialect kMoriioReadSimDialect;   // moriio_read.cc
extern const SimDialect kMoriioWriteSimDialect;  // moriio_write.cc
extern const SimDialect kMooncakeSimDialect;     // mooncake.cc
extern const SimDialect kP2pNcclSimDialect;      // p2p_nccl.cc
extern const SimDialect kSglangSimDialect;       // sglang.cc
extern const SimDialect kNixlPushSimDialect;     // nixl_push.cc

const std::vector<const SimDialect*>& sim_dialects() {
  static const std::vector<const SimDialect*> table{
      &kNixlSimDialect,    &kMoriioReadSimDialect, &kMoriioWriteSimDialect,
      &kMooncakeSimDialect, &kP2pNcclSimDialect,   &kSglangSimDialect,
      &kNixlPushSimDialect,
  };
  return table;
}

const SimDialect* find_sim_dialect(proto::Connector connector, proto::TransferMode mode) {
  for (const SimDialect* d : sim_dialects()) {
    if (d->connector == connector && d->transfer_mode == mode) return d;
  }
  return nullptr;
}

proto::TransferMode default_transfer_mode(proto::Connector connector) {
  for (const SimDialect* d : sim_dialects()) {
    if (d->connector == connector) return d->transfer_mode;
  }
  return proto::TransferMode::kNone;
}

uint32_t side_port_count(const SimDialect& dialect, const KvNodeIdentity& node) {
  uint32_t count = 0;
  for (const SidePortRange& range : dialect.side_channel(node)) count += range.count;
  return count;
}

}  // namespace pdr::node::sim
