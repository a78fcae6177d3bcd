// NIXL (PROTOCOLS.md 3): serial; the decode takes the prefill answer's kv_transfer_params
// verbatim. The decode pulls the blocks by those params, which any decode can use: a decode that
// never got the request may be replaced alone.
#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status build(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill, JsonObjectBody*) {
  plan->request_id = make_uuid4(in.random).dashed();
  // The same for every request: a constant, not built per request.
  static constexpr std::string_view kPrefillParams =
      R"({"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,)"
      R"("remote_block_ids":null,"remote_host":null,"remote_port":null})";
  prefill->set_raw("kv_transfer_params", kPrefillParams);
  apply_prefill_edits(prefill);
  return Status::ok();  // the decode is the client's body until finish_decode
}

// Verbatim: newer vLLM adds keys (remote_request_id, dcp_size, ...) that decode needs.
Status finish_decode(std::string_view params_raw, const JsonObjectBody&, const JsonLimits&,
                     JsonObjectBody* decode) {
  decode->set_raw("kv_transfer_params", params_raw);
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kNixlDialect;
const Dialect kNixlDialect{
    .name = "nixl",
    .connector = Connector::kNixl,
    .transfer_mode = TransferMode::kNone,
    .concurrent = false,
    .decode_needs_prefill_params = true,
    .decode_alone_retry = DecodeAloneRetry::kIfNeverSent,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kNone,
    .prefill_bootstrap_port_default = false,
    .build = &dialects::build,
    .finish_decode = &dialects::finish_decode,
    .without_kv = &dialects::drop_kv_transfer_params,
};
}  // namespace pdr::proto
