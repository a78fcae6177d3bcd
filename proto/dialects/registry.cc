// The dialect table: one line per dialect (each defined in its own file here).
#include <array>

#include "proto/dialects/dialect.h"

namespace pdr::proto {

extern const Dialect kNixlDialect;
extern const Dialect kMoriioReadDialect;
extern const Dialect kMoriioWriteDialect;
extern const Dialect kMooncakeDialect;
extern const Dialect kP2pNcclDialect;
extern const Dialect kSglangDialect;
extern const Dialect kNixlPushDialect;

namespace {

const std::array<const Dialect*, 7> kTable = {
    &kNixlDialect,
    &kMoriioReadDialect,
    &kMoriioWriteDialect,
    &kMooncakeDialect,
    &kP2pNcclDialect,
    &kSglangDialect,
    &kNixlPushDialect,
};

}  // namespace

std::span<const Dialect* const> all_dialects() { return kTable; }

size_t dialect_index(const Dialect* d) {
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (kTable[i] == d) return i;
  }
  return kTable.size();
}

const Dialect* any_dialect_of(Connector connector) {
  for (const Dialect* d : kTable) {
    if (d->connector == connector) return d;
  }
  return nullptr;
}

TransferMode pairing_mode(Connector connector, TransferMode transfer_mode) {
  for (const Dialect* d : kTable) {
    if (d->connector == connector && d->transfer_mode != TransferMode::kNone) return transfer_mode;
  }
  return TransferMode::kNone;
}

const Dialect* dialect_for(Connector connector, TransferMode transfer_mode) {
  const TransferMode mode = pairing_mode(connector, transfer_mode);
  for (const Dialect* d : kTable) {
    if (d->connector == connector && d->transfer_mode == mode) return d;
  }
  return nullptr;
}

}  // namespace pdr::proto
