// NIXL push (vLLM's NixlPushConnector, vllm-project/vllm#35264): concurrent. The decode allocates
// its blocks, registers them with the prefill over NIXL and waits; the prefill WRITEs its KV into
// them once its leg finishes. The decode therefore needs nothing the prefill computes, only who
// the prefill is (engine id, side channel, TP/PP sizes), which the router knows from the prefill's
// registration or topology entry; sending both legs at once lets the decode register before the
// prefill finishes (sending them one after the other makes push slower than pull:
// vllm-project/router#187). Both legs carry the same X-Request-Id and a transfer_id that is new
// for every build, so every retry pairs afresh. A failed decode needs a whole new pair: the
// prefill pushes into the decode that registered. Wire facts: proto/REQUEST_LEGS.md.
#include <string>

#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status build(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill, JsonObjectBody* decode) {
  const LegInstance& p = in.prefill;
  if (p.dp_size > 1 && !in.prefill_rank) {
    return Status(StatusCode::kRejected, "NIXL push prefill has dp_size > 1 but no DP rank was chosen");
  }
  if (p.engine_id.empty()) {
    return Status(StatusCode::kRejected, "NIXL push prefill has no engine_id (its kv_transfer_config engine_id)");
  }
  if (!p.kv_address) {
    return Status(StatusCode::kRejected,
                  "NIXL push prefill has no side channel (zmq_address host:port, VLLM_NIXL_SIDE_CHANNEL_HOST:PORT)");
  }
  // vLLM with data parallelism: each rank's engine id is "<engine_id>_dp<rank>" and its side
  // channel listens on the base port + rank.
  const uint32_t rank = p.dp_size > 1 ? *in.prefill_rank : 0;
  const uint32_t port = uint32_t{p.kv_address->port} + rank;
  if (port > 65535) {
    return Status(StatusCode::kRejected, "NIXL push prefill side channel port + DP rank is past 65535");
  }
  std::string engine = p.engine_id;
  if (p.dp_size > 1) engine += "_dp" + std::to_string(rank);

  plan->request_id = make_uuid4(in.random).dashed();
  // A second uuid, not derived from the request id: a retry rebuilds the legs and so gets a new one.
  plan->transfer_id = "xfer-" + make_uuid4(in.random).dashed();
  prefill->set_raw("kv_transfer_params", JsonObjectWriter()
                                             .boolean("do_remote_decode", true)
                                             .boolean("do_remote_prefill", false)
                                             .null("remote_engine_id")
                                             .null("remote_block_ids")
                                             .null("remote_host")
                                             .null("remote_port")
                                             .string("transfer_id", plan->transfer_id)
                                             .finish());
  apply_prefill_edits(prefill);
  decode->set_raw("kv_transfer_params", JsonObjectWriter()
                                            .boolean("do_remote_decode", false)
                                            .boolean("do_remote_prefill", true)
                                            .string("remote_engine_id", engine)
                                            .string("remote_host", p.kv_address->host)
                                            .integer("remote_port", port)
                                            .integer("tp_size", p.tp_size)
                                            .integer("pp_size", p.pp_size)
                                            .string("remote_request_id", plan->request_id)
                                            .string("transfer_id", plan->transfer_id)
                                            .finish());
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kNixlPushDialect;
const Dialect kNixlPushDialect{
    .name = "nixl-push",
    .connector = Connector::kNixlPush,
    .transfer_mode = TransferMode::kNone,
    .concurrent = true,
    .decode_needs_prefill_params = false,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kPrefillHostPort,
    .prefill_bootstrap_port_default = false,
    .prefill_needs_engine_id = true,
    .build = &dialects::build,
    .finish_decode = nullptr,
    .without_kv = nullptr,
};
}  // namespace pdr::proto
