#include "router/routing/multi_turn.h"

#include "proto/dialects/dialect.h"
#include "proto/multi_turn.h"
#include "router/routing/conversation_binding.h"

namespace pdr::router::routing {

namespace {

void bump(MultiTurnCounters::Counter& c) { c.fetch_add(1, std::memory_order_relaxed); }

// A stream chunk is small; its kv_transfer_params too. The reader bounds what one event may hold.
constexpr size_t kMaxEventBytes = 1 << 20;

proto::JsonLimits params_limits() {
  proto::JsonLimits limits;
  limits.max_bytes = kMaxEventBytes;
  return limits;
}

}  // namespace

std::optional<std::string> MultiTurnRequest::begin(const proto::JsonObjectBody& body,
                                                   const config::Topology& topology, bool single_choice,
                                                   std::string_view authorization, std::string_view bind_header_value,
                                                   ConversationCache& cache, MultiTurnCounters& counters,
                                                   std::optional<MultiTurnRequest>* out) {
  out->reset();
  if (!topology.multi_turn.enabled || !body.has("conversation_id") || body.is_null("conversation_id")) {
    return std::nullopt;
  }
  std::optional<std::string> id;
  if (!body.get_string("conversation_id", &id).is_ok() || !id) return "conversation_id must be a string";
  if (id->empty() || id->size() > kMaxConversationIdBytes) {
    return "conversation_id must be 1 to " + std::to_string(kMaxConversationIdBytes) + " bytes";
  }
  MultiTurnRequest& r = out->emplace();
  r.conversation_id_ = std::move(*id);
  if (!single_choice) return std::nullopt;
  std::optional<std::string> binding = conversation_binding(topology.multi_turn, authorization, bind_header_value);
  if (!binding || (binding->empty() && !topology.multi_turn.allow_anonymous)) {
    bump(counters.anonymous);  // (no binding at all: OpenSSL out of memory)
    return std::nullopt;
  }
  r.binding_ = std::move(*binding);
  r.keeps_entries_ = true;
  bool other_binding = false;
  r.reuse_ = cache.take(r.key(), ConversationCache::Clock::now(), topology.multi_turn.ttl, &other_binding);
  // Another client's id: a new conversation of this client; the other entry stays untouched.
  if (!r.reuse_) bump(other_binding ? counters.binding_mismatch : counters.no_entry);
  return std::nullopt;
}

void MultiTurnRequest::on_legs_built(proto::LegBuild& legs, const discovery::Instance& decode,
                                     MultiTurnCounters& counters) {
  // Not a field vLLM knows: the reference proxy pops it before either leg.
  legs.prefill.body.remove("conversation_id");
  legs.decode.body.remove("conversation_id");
  reuses_kv_ = keeps_entries_ && legs.plan.dialect != nullptr && legs.plan.dialect->multi_turn_reuse;
  if (!reuse_) return;
  if (reuses_kv_ && decode.key == reuse_->decode_key && decode.epoch == reuse_->decode_epoch) {
    // The prefill connects where the params point. They are the decode's word (or, mirrored
    // through etcd, another writer's): the decode's own host only, as on the pairing path.
    if (Status st = proto::check_next_turn_remote_host(reuse_->prefill_params, decode.http_address.host,
                                                       legs.plan.prefill_host, params_limits());
        !st.is_ok()) {
      bump(counters.remote_host_mismatch);
    } else {
      legs.prefill.body.set_raw("kv_transfer_params", reuse_->prefill_params);
      bump(counters.reused);
    }
  } else {
    // Gone, restarted, draining, ejected or no longer a reusing dialect: a normal turn.
    bump(counters.decode_unavailable);
  }
  reuse_.reset();  // single use, also when a retry rebuilds the legs
}

void MultiTurnRequest::on_decode_bytes(std::string_view chunk) {
  if (!reuses_kv_) return;
  if (!stream_) stream_.emplace(kMaxEventBytes);
  // A failed reader (an event over the limit) stays failed: no params, no entry.
  (void)stream_->feed(chunk, [this](const proto::SseEvent& event) {
    if (event.data.find("\"kv_transfer_params\"") == std::string_view::npos) return;
    if (auto params = proto::kv_transfer_params_of(event.data, params_limits())) final_params_.assign(*params);
  });
}

void MultiTurnRequest::on_decode_json(std::string_view body) {
  if (!reuses_kv_) return;
  if (auto params = proto::kv_transfer_params_of(body, params_limits())) final_params_.assign(*params);
}

void MultiTurnRequest::on_done(const discovery::Instance& decode, const config::Topology& topology,
                               ConversationCache& cache, MultiTurnCounters& counters) {
  if (!reuses_kv_) return;
  std::string params;
  if (final_params_.empty() ||
      !proto::next_turn_prefill_params(final_params_, decode.http_address.host, params_limits(), &params).is_ok()) {
    bump(counters.no_params);
    return;
  }
  ConversationCache::Limits limits;
  limits.ttl = topology.multi_turn.ttl;
  limits.max_entries = topology.multi_turn.max_entries;
  limits.max_bytes = topology.multi_turn.max_bytes;
  cache.put(key(), ConversationCache::Entry{decode.key, decode.epoch, std::move(params)},
            ConversationCache::Clock::now(), limits);
  bump(counters.stored);
}

}  // namespace pdr::router::routing
