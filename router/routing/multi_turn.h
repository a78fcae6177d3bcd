// One request's side of multi-turn KV reuse (topology multi_turn:, for the dialects with
// Dialect::multi_turn_reuse, i.e. NIXL; conversation_cache.h
// holds the entries, proto/multi_turn.h the wire facts). The session calls, in order:
//   begin()          after parsing: reads and checks "conversation_id", takes the entry its
//                    last turn left (single use) under the client's binding
//                    (conversation_binding.h: another client's turn with the same id finds
//                    nothing and stores its own entry); preferred_decode() then steers pairing;
//   on_legs_built()  removes "conversation_id" from both legs and, when the pair has the
//                    entry's decode, gives the prefill the decode's params (it pulls the blocks);
//   on_decode_bytes() / on_decode_json()  watch the decode's answer for its final
//                    kv_transfer_params (the last stream chunk carrying them, or the JSON answer);
//   on_done()        when the answer ended well: stores the next turn's entry.
// Entries are never stored for failed answers (the session does not call on_done), answers
// without params, answers with n > 1, or anonymous requests when multi_turn.allow_anonymous is
// false. The session relays the decode's answer with its kv_transfer_params removed
// (proto/answer_kv_params.h) after these calls have read them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "proto/json_splice.h"
#include "proto/request_legs.h"
#include "proto/sse_reader.h"
#include "router/routing/conversation_cache.h"
#include "router/routing/multi_turn_counters.h"

namespace pdr::router::routing {

class MultiTurnRequest {
 public:
  static constexpr size_t kMaxConversationIdBytes = 512;

  // Empty optional: no multi-turn for this request (disabled, or no conversation_id). A message:
  // the client's conversation_id is unusable (400). Else *out is set up. `single_choice` false
  // (n > 1: served by a decode alone, several answers): conversation_id is still removed from
  // the legs, but the conversation's entry is neither used nor replaced. `authorization` and
  // `bind_header_value` are the client's credentials (the binding's input; neither is kept).
  static std::optional<std::string> begin(const proto::JsonObjectBody& body, const config::Topology& topology,
                                          bool single_choice, std::string_view authorization,
                                          std::string_view bind_header_value, ConversationCache& cache,
                                          MultiTurnCounters& counters, std::optional<MultiTurnRequest>* out);

  std::string_view preferred_decode() const { return reuse_ ? std::string_view(reuse_->decode_key) : std::string_view(); }

  void on_legs_built(proto::LegBuild& legs, const discovery::Instance& decode, MultiTurnCounters& counters);
  void on_decode_bytes(std::string_view chunk);
  void on_decode_json(std::string_view body);
  void on_done(const discovery::Instance& decode, const config::Topology& topology, ConversationCache& cache,
               MultiTurnCounters& counters);

 private:
  ConversationCache::Key key() const { return {binding_, conversation_id_}; }

  std::string conversation_id_;
  std::string binding_;                            // conversation_binding.h
  bool keeps_entries_ = false;                     // single choice, and a binding allowed to reuse
  std::optional<ConversationCache::Entry> reuse_;  // until the first legs are built
  std::optional<proto::SseReader> stream_;         // created on the first streamed bytes
  std::string final_params_;                       // the decode's latest kv_transfer_params
  bool reuses_kv_ = false;  // keeps_entries_ and the pair's dialect has multi_turn_reuse
};

}  // namespace pdr::router::routing
