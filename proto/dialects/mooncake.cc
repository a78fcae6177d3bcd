// Mooncake (docs/design/wire-formats.md 4): concurrent; the prefill pushes to the decode through the bootstrap
// server, whose /query table (DP rank -> engine_id) the router reads first (the pre-step,
// router/routing/pre_step.h). A failed decode needs a whole new pair.
#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status build(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill, JsonObjectBody* decode) {
  const LegInstance& p = in.prefill;
  if (p.dp_size > 1 && !in.prefill_rank) {
    return Status(StatusCode::kRejected,
                  "Mooncake prefill has dp_size > 1 but no DP rank was chosen");
  }
  if (p.mooncake_engine_id.empty()) {
    return Status(StatusCode::kRejected,
                  "Mooncake prefill has no engine_id for the chosen DP rank (bootstrap /query "
                  "not answered yet)");
  }
  plan->request_id = make_uuid4(in.random).dashed();
  plan->transfer_id = "xfer-" + plan->request_id;
  const std::string& host = p.bootstrap_host.empty() ? p.http_address.host : p.bootstrap_host;
  const std::string bootstrap =
      http_origin(host, p.bootstrap_port.value_or(in.options.default_bootstrap_port));
  prefill->set_raw("kv_transfer_params", JsonObjectWriter()
                                             .boolean("do_remote_decode", true)
                                             .boolean("do_remote_prefill", false)
                                             .string("transfer_id", plan->transfer_id)
                                             .finish());
  apply_prefill_edits(prefill);
  decode->set_raw("kv_transfer_params", JsonObjectWriter()
                                            .boolean("do_remote_decode", false)
                                            .boolean("do_remote_prefill", true)
                                            .string("remote_bootstrap_addr", bootstrap)
                                            .string("remote_engine_id", p.mooncake_engine_id)
                                            .string("transfer_id", plan->transfer_id)
                                            .finish());
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kMooncakeDialect;
const Dialect kMooncakeDialect{
    .name = "mooncake",
    .connector = Connector::kMooncake,
    .transfer_mode = TransferMode::kNone,
    .concurrent = true,
    .decode_needs_prefill_params = false,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kPrefillEngineQuery,
    .zmq_address = ZmqAddressForm::kNone,
    .prefill_bootstrap_port_default = true,
    .build = &dialects::build,
    .finish_decode = nullptr,
    .without_kv = nullptr,
};
}  // namespace pdr::proto
