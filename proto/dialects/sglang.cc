// SGLang (PROTOCOLS.md 7): concurrent; the same body to both legs, naming the prefill's
// bootstrap server and a random room. The prefill pushes to the decode the room pairs it with:
// a failed decode needs a whole new pair.
#include <limits>

#include "proto/dialects/dialect.h"
#include "proto/dialects/leg_edits.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status build(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill, JsonObjectBody* decode) {
  const LegInstance& p = in.prefill;
  plan->request_id = make_uuid4(in.random).dashed();
  plan->bootstrap_room = in.random() & static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const std::string& host = p.bootstrap_host.empty() ? p.http_address.host : p.bootstrap_host;
  prefill->set_raw("bootstrap_host", json_string(bracket_host(host)));
  prefill->set_raw("bootstrap_port", p.bootstrap_port ? json_int(*p.bootstrap_port) : json_null());
  prefill->set_raw("bootstrap_room", json_uint(*plan->bootstrap_room));
  *decode = *prefill;
  return Status::ok();
}

}  // namespace
}  // namespace pdr::proto::dialects

namespace pdr::proto {
extern const Dialect kSglangDialect;
const Dialect kSglangDialect{
    .name = "sglang",
    .connector = Connector::kSglang,
    .transfer_mode = TransferMode::kNone,
    .concurrent = true,
    .decode_needs_prefill_params = false,
    .decode_alone_retry = DecodeAloneRetry::kNever,
    .pre_step = PreStep::kNone,
    .zmq_address = ZmqAddressForm::kNone,
    .prefill_bootstrap_port_default = false,
    .build = &dialects::build,
    .finish_decode = nullptr,
    .without_kv = nullptr,
    // SGLang servers have no /inference/v1/generate: their tokens-in endpoint is /generate with
    // input_ids and the bootstrap fields in another body, which this dialect does not build.
    .tokens_in_unsupported = "SGLang nodes do not serve /inference/v1/generate (their tokens-in "
                             "endpoint is /generate, with another body)",
    // SGLang's /v1/messages builds its chat request from the Anthropic fields alone
    // (python/sglang/srt/entrypoints/anthropic/request_conversion.py): bootstrap_host,
    // bootstrap_port and bootstrap_room are dropped, so its prefill and decode would never pair.
    .messages_unsupported = "SGLang's /v1/messages drops the bootstrap fields that pair its prefill and "
                            "decode (it rebuilds the request from Anthropic's fields only)",
};
}  // namespace pdr::proto
