// MoRIIO READ (PROTOCOLS.md 1.3 step 7): serial; the decode reads the blocks the prefill's answer
// names, so it gets remote_engine_id, remote_block_ids, transfer_id and tp_size from it. The
// request id names the decode: a failed decode needs a whole new pair.
#include <string>

#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/dialects/moriio_legs.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status finish_decode(const LegPlan&, std::string_view, const JsonObjectBody& params, const JsonLimits& limits,
                     JsonObjectBody* decode) {
  for (std::string_view key : {"remote_engine_id", "remote_block_ids"}) {
    if (!params.has(key) || params.is_null(key)) {
      return Status(StatusCode::kMissingKey,
                    "prefill response kv_transfer_params lacks " + std::string(key));
    }
  }
  const auto decode_raw = decode->get_raw("kv_transfer_params");
  // Borrows decode's bytes: rendered below before decode is edited. Built by build_moriio_legs
  // (valid JSON): indexed, not validated again.
  JsonObjectBody decode_params;
  if (!decode_raw || !JsonObjectBody::parse_member_borrowed(*decode_raw, limits, &decode_params).is_ok()) {
    return Status(StatusCode::kInternal, "decode body has no kv_transfer_params object");
  }
  for (std::string_view key : {"remote_engine_id", "remote_block_ids", "transfer_id", "tp_size"}) {
    if (const auto v = params.get_raw(key)) decode_params.set_raw(key, *v);
  }
  decode->set_raw("kv_transfer_params", decode_params.render());
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kMoriioReadDialect;
const Dialect kMoriioReadDialect{
    .name = "moriio-read",
    .connector = Connector::kMoriio,
    .transfer_mode = TransferMode::kRead,
    .concurrent = false,
    .decode_needs_prefill_params = true,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kMoriio,
    .prefill_bootstrap_port_default = false,
    .build = &dialects::build_moriio_legs,
    .finish_decode = &dialects::finish_decode,
    .without_kv = &dialects::drop_kv_transfer_params,
};
}  // namespace pdr::proto
