// NIXL (PROTOCOLS.md 3): serial; the decode takes the prefill answer's kv_transfer_params
// verbatim, once its remote_host is the prefill's own host. The decode pulls the blocks by those params, which any decode can use: a decode that
// never got the request may be replaced alone.
#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/quoted_text.h"
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

// The decode connects to the prefill's NIXL side channel at remote_host (vLLM's NixlConnector
// puts VLLM_NIXL_SIDE_CHANNEL_HOST there). The answer is the prefill's word, and any admitted node
// may be a prefill: copied unchecked, it could aim the decode's handshake at any third host. So
// the host must be the prefill's registered one, or a loopback host when both nodes registered
// the same host (proto::side_channel_host_ok; multi-turn applies it to the decode's answer).
// Absent or null: nothing to aim (the decode fails on its own).
Status check_remote_host(const LegPlan& plan, const JsonObjectBody& params) {
  if (!params.has("remote_host") || params.is_null("remote_host")) return Status::ok();
  std::optional<std::string> host;
  if (Status st = params.get_string("remote_host", &host); !st) {
    return Status(st.code(), "prefill response kv_transfer_params: " + st.message());
  }
  if (side_channel_host_ok(*host, plan.prefill_host, plan.decode_host)) return Status::ok();
  return Status(StatusCode::kRejected,
                "prefill response kv_transfer_params names remote_host " + quote_untrusted(*host) +
                    ", not the prefill's own host " + quote_untrusted(plan.prefill_host) +
                    " (its VLLM_NIXL_SIDE_CHANNEL_HOST must be the host it registered); decode not sent");
}

// Verbatim: newer vLLM adds keys (remote_request_id, dcp_size, ...) that decode needs.
Status finish_decode(const LegPlan& plan, std::string_view params_raw, const JsonObjectBody& params,
                     const JsonLimits&, JsonObjectBody* decode) {
  if (Status st = check_remote_host(plan, params); !st) return st;
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
