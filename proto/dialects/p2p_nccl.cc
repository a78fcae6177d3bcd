// P2P-NCCL (docs/design/wire-formats.md 2): serial with nothing to relay (the prefill's answer is drained, then
// the decode is sent); no kv params; the request id names both instances, so a failed decode
// needs a whole new pair.
#include "proto/dialects/dialect.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status build(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill, JsonObjectBody* decode) {
  const LegInstance& p = in.prefill;
  const LegInstance& d = in.decode;
  if (p.zmq_address.empty() || d.zmq_address.empty()) {
    return Status(StatusCode::kRejected, "P2P-NCCL instances need a zmq_address");
  }
  plan->request_id = make_addressed_request_id(p.zmq_address, d.zmq_address, make_uuid4(in.random));
  prefill->set_raw("max_tokens", "1");
  if (prefill->has("max_completion_tokens")) prefill->set_raw("max_completion_tokens", "1");
  // Not in the reference proxy, but Implications 7: vLLM refuses min_tokens > max_tokens, so a
  // client's min_tokens >= 2 would fail the prefill leg with a 400.
  prefill->remove("min_tokens");
  prefill->remove("min_completion_tokens");
  // The connector ignores kv_transfer_params (docs/design/wire-formats.md 2), but a client's own must not
  // reach the nodes either (a client steering the nodes' KV transfer): every other dialect overwrites it.
  prefill->remove("kv_transfer_params");
  decode->remove("kv_transfer_params");
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kP2pNcclDialect;
const Dialect kP2pNcclDialect{
    .name = "p2p-nccl",
    .connector = Connector::kP2pNccl,
    .transfer_mode = TransferMode::kNone,
    .concurrent = false,
    .decode_needs_prefill_params = false,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kHostPort,
    .prefill_bootstrap_port_default = false,
    .build = &dialects::build,
    .finish_decode = nullptr,
    .without_kv = nullptr,
};
}  // namespace pdr::proto
