#include "proto/dialects/moriio_legs.h"

#include <string>

#include "proto/dialects/leg_edits.h"
#include "proto/request_legs.h"

namespace pdr::proto::dialects {
namespace {

Status resolve_moriio_zmq(const LegInstance& inst, const char* which, MoriioZmqAddress* out) {
  if (inst.moriio_zmq) {
    *out = *inst.moriio_zmq;
    return Status::ok();
  }
  Status st = parse_moriio_zmq_address(inst.zmq_address, out);
  if (!st) {
    return Status(StatusCode::kRejected,
                  std::string(which) + " MoRIIO instance has no usable zmq_address: " + st.message());
  }
  return Status::ok();
}

void add_remote_addresses(JsonObjectWriter* w, const MoriioZmqAddress& peer) {
  w->string("remote_host", peer.host)
      .integer("remote_handshake_port", peer.handshake_port)
      .integer("remote_notify_port", peer.notify_port);
}

}  // namespace

Status build_moriio_legs(const DialectInput& in, LegPlan* plan, JsonObjectBody* prefill_body,
                         JsonObjectBody* decode_body) {
  const LegInstance& p = in.prefill;
  const LegInstance& d = in.decode;
  if (p.transfer_mode != d.transfer_mode || p.transfer_mode == TransferMode::kNone) {
    return Status(StatusCode::kRejected,
                  "MoRIIO prefill and decode transfer modes must both be READ or both WRITE (got " +
                      std::string(to_string(p.transfer_mode)) + " and " +
                      std::string(to_string(d.transfer_mode)) + ")");
  }
  if (p.dp_size > 1 && !in.prefill_rank) {
    return Status(StatusCode::kRejected,
                  "MoRIIO prefill has dp_size > 1 but no DP rank was chosen");
  }
  MoriioZmqAddress pz, dz;
  if (Status st = resolve_moriio_zmq(p, "prefill", &pz); !st) return st;
  if (Status st = resolve_moriio_zmq(d, "decode", &dz); !st) return st;

  plan->request_id = make_addressed_request_id(p.zmq_address, d.zmq_address, make_uuid4(in.random));
  plan->transfer_id = "tx-" + make_uuid4(in.random).dashed();

  JsonObjectWriter pk;
  pk.integer("remote_dp_size", d.dp_size)
      .integer("remote_tp_size", d.tp_size)
      .string("transfer_id", plan->transfer_id)
      .boolean("do_remote_decode", true)
      .boolean("do_remote_prefill", false)
      .null("remote_engine_id")
      .null("remote_block_ids");
  if (in.options.moriio_send_remote_addresses) add_remote_addresses(&pk, dz);
  prefill_body->set_raw("kv_transfer_params", pk.finish());
  apply_prefill_edits(prefill_body);

  JsonObjectWriter dk;
  dk.boolean("do_remote_decode", false)
      .boolean("do_remote_prefill", true)
      .null("remote_engine_id")
      .null("remote_block_ids")
      .string("transfer_id", plan->transfer_id)
      .integer("remote_dp_size", p.dp_size)
      .integer("remote_tp_size", p.tp_size);
  if (p.dp_size > 1) dk.integer("remote_dp_rank", *in.prefill_rank);
  if (in.options.moriio_send_remote_addresses) add_remote_addresses(&dk, pz);
  decrement_decode_tokens(decode_body);
  decode_body->set_raw("kv_transfer_params", dk.finish());
  return Status::ok();
}

}  // namespace pdr::proto::dialects
