// ProxySession: one client request to /v1/completions or /v1/chat/completions, carried through
// the request state machine of docs/design/request-flow.md on the worker that accepted it.
//
//   ACCEPTED -> PAIRED -> PREFILL_SENT -> PREFILL_DONE -> DECODE_SENT -> STREAMING -> DONE
//   (concurrent dialects: PREFILL_SENT -> DECODE_SENT at once, the prefill answer is read and
//   dropped; conditional disaggregation: PAIRED -> DECODE_SENT, the decode alone with the
//   dialect's no-KV request, the pair's prefill released, a decode failure re-pairing); FAILED
//   and CANCELLED from every state. Every transition is counted (ProxyCounters::transitions).
//
// Where the request goes is routing's (router/routing/): the session reaches it through one
// door, routing::RequestRoute (router/routing/request_route.h), begun after parsing and asked
// once per attempt (pair_and_send -> on_routed); it is told what the legs did (a node answered
// or could not be connected to, a node to avoid, legs built, the prefill's answer time, the
// decode's answer for multi-turn, cancellation). Behind it, while the request rests in
// ACCEPTED: with policies.cache_aware.tokenize: node, one node's /tokenize for a text prompt
// (cache_tokenize.h), the SLO wait (slo_gate.h) and the dialect's pre-step (pre_step.h), each
// cancelled like a leg by a client disconnect or the request deadline; pairing itself
// (pairing.h, steered by multi-turn KV reuse and session affinity), the cache lookup, and
// conditional disaggregation (decode_alone.h). Multi-turn KV reuse (multi_turn.h) edits the
// built legs; it adds no state.
//
// What each event does, in every state:
//  - client disconnect: every open leg is closed at once (that is how vLLM aborts a request and
//    frees its KV blocks) -> CANCELLED; a tokens-in leg open on a node started with vLLM's
//    --tokens-only is also aborted by id with its POST /abort_requests (abort_requests.h).
//  - prefill error, 5xx or timeout: in concurrent dialects the decode leg is closed at once;
//    then a new pair with fresh ids (request id, transfer id, bootstrap room) and a prefill not
//    tried before, within retries.prefill_attempts; stale kv_transfer_params are never reused.
//    A 4xx from the prefill is the client's fault: relayed as is (DONE), never retried.
//  - prefill 2xx without kv_transfer_params (EOS on the first token): the dialects with a no-KV
//    fallback (Dialect::without_kv: NIXL, MoRIIO READ) send the decode as a plain request (it
//    recomputes the prompt) instead of a decode that would wait for blocks that never come.
//  - decode error, 5xx or timeout before its answer reached the client: retried within
//    retries.decode_attempts on a decode not tried before: the same decode body where the
//    dialect allows it (NIXL), a whole new pair for the dialects whose ids name the decode
//    (retry_rules.h).
//
// Dialects (proto/dialects/dialect.h) are never named here: the table line of the pair says
// whether the legs are concurrent, what the decode takes from the prefill, the no-KV fallback,
// the retry scope and the pre-step run before the legs are built. The client's body is parsed
// once (begin()); legs stay unrendered until the upstream client writes them out.
//  - decode failure after the head reached the client: an SSE stream ends with an OpenAI-style
//    error event and data: [DONE] (never a silent truncation), a /v1/responses stream with the
//    Responses API's error and response.failed events and no [DONE] (proto/responses_stream.h),
//    a /v1/messages stream with Anthropic's `event: error` (proto/anthropic_messages.h);
//    a buffered JSON answer becomes 502. pdrouter's error answers on /v1/messages are Anthropic's
//    shape (client_api.h).
//  - timeouts (topology timeouts.*): connect, prefill (whole prefill leg, a deadline from its
//    start), first_byte (decode leg sent -> first byte; in concurrent dialects this includes the
//    prefill; an event stream's head is held back until its first data event, which is due
//    within first_byte too, so a decode that sent only its head is still retried), stream_idle,
//    client_write (a stream paused for a client that reads nothing is aborted: legs closed,
//    client connection cut), request (whole request, optional: 504 request_deadline).
//  - concurrent dialects: a prefill leg still open when the request ended is an orphan: its
//    answer is dropped unread and it is closed after timeouts.orphan_grace_ms (or its prefill
//    deadline). It holds no admission slot; limits.max_orphan_legs_per_node bounds orphans per
//    prefill node, a new one over it closing the oldest (orphan_legs.h).
//  - router shutdown: the server drains in-flight sessions; new ones are refused earlier (503).
//
// The decode's answer is relayed as it arrives: status, Content-Type and each chunk of an SSE
// stream are flushed at once; a JSON answer is relayed whole. When the client reads slowly the
// decode leg is paused above kHighWater buffered bytes and resumed on drain, so memory per
// request stays bounded. The client's body and a buffered JSON answer take their bytes from
// limits.max_buffered_bytes, shared by all workers (503 memory_budget beyond it); the bodies are
// freed when the request ends.
//
// Worker thread only. The session keeps itself alive through its upstream callbacks; the writer
// callbacks hold it weakly.
// Every upstream call, the route's too, goes through WorkerContext::upstream() (upstream_port.h),
// which tests/router/proxy_session_test.cc replaces with a fake to drive this state machine.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "router/http/http_message.h"
#include "router/http/response_writer.h"
#include "router/clients/access_record.h"
#include "router/clients/tenant_registry.h"
#include "router/proxy/proxy_shared.h"
#include "router/routing/request_route.h"
#include "router/routing/slo_headers.h"
#include "router/tracing/request_trace.h"

namespace pdr::router::proxy {

// Body of a request already admitted by ProxyService (content type checked, in_flight counted:
// the session decrements it when it ends).
struct AdmittedRequest {
  std::string path;           // "/v1/completions" or "/v1/chat/completions"
  std::string body;
  std::string authorization;  // client's Authorization header, "" if none
  std::string affinity_header_value;
  std::string bind_header_value;  // multi_turn.bind_to header:<name>: that header's value
  // The first of session_affinity.headers the client sent, its value; nullopt: none.
  std::optional<std::string> session_header_value;
  // Bytes of limits.max_buffered_bytes reserved for `body` by ProxyService (BufferBudget::
  // reserve, router/routing/buffer_budget.h); the session gives them back when it is destroyed.
  size_t budget_bytes = 0;
  // When the request head was parsed (http::Request::head_at): the latency histograms start
  // there. Unset (epoch): the session's creation.
  std::chrono::steady_clock::time_point arrived_at{};
  // `authorization` may go on to the nodes (router/clients/client_gate.h: not with client keys,
  // unless client_auth.forward_client_key); it still binds multi-turn conversations.
  bool forward_authorization = true;
  // The request's tenant (router/clients/tenant_registry.h): its name, and its hold on the
  // tenant's limits (an in-flight slot; the tokens begin() reserves), settled from the answer's
  // usage when the session ends. An empty ticket: no tenant (tests).
  std::string tenant;
  clients::TenantTicket ticket;
  // Its latency objectives (router/routing/slo_headers.h); none by default.
  RequestSlo slo;
  // With the access log on: the request's record as ProxyService knew it (client, tenant, path,
  // trace id, bytes in); the session completes it and logs it when it ends. Null: log off.
  std::unique_ptr<clients::AccessRecord> log_record;
  // Its trace (router/tracing/request_trace.h); null when not traced (tracing off, not sampled).
  std::unique_ptr<tracing::RequestTrace> trace;
};

class ProxySession : public std::enable_shared_from_this<ProxySession>, private routing::RouteListener {
 public:
  static constexpr size_t kHighWater = 256 * 1024;         // client buffer that pauses the decode
  static constexpr size_t kMaxPrefillAnswer = 4 << 20;      // prefill JSON kept for the decode
  static constexpr size_t kMaxBufferedAnswer = 64 << 20;    // non-stream decode answer
  static constexpr size_t kMaxErrorAnswer = 64 * 1024;      // an error body kept to relay
  static constexpr size_t kMaxPartialEvent = 1 << 20;       // SSE bytes held back for one event

  // Starts the state machine; the session lives until it reaches DONE/FAILED/CANCELLED.
  static void start(WorkerContext& worker, AdmittedRequest request, http::ResponseWriter writer);

  ProxySession(WorkerContext& worker, AdmittedRequest request, http::ResponseWriter writer);
  ~ProxySession();

 private:
  void begin();
  // Asks the request's route (router/routing/request_route.h) for a pair; on_routed() gets the
  // answer. `retry_of`: the leg whose failure this new pair retries (counted once a pair is found).
  void pair_and_send(std::optional<Leg> retry_of = std::nullopt);
  // routing::RouteListener: the session is its route's listener.
  void on_paired(const routing::Pair& pair) override;
  void on_routed(routing::Route* route, routing::RouteRefusal* refusal) override;
  std::shared_ptr<void> keep_alive() override;
  void send_prefill();
  void send_decode();
  void on_prefill_complete();
  void prefill_failed(LegFailure cause, std::string detail);
  void decode_failed(LegFailure cause, std::string detail);
  void on_prefill_deadline();
  // An orphan's end: its grace or deadline is over, or a newer orphan of its node evicted it
  // (orphan_legs.h). Closes the prefill leg (counted) and takes it off the worker's list.
  void close_orphan();
  void orphan_done();
  void on_request_deadline();
  void on_decode_head(int status, const std::vector<http::Header>& headers);
  bool start_client_stream();  // false if the client is gone (the session then ended)
  bool reserve_answer_budget(size_t bytes);
  void release_answer_budget();
  void arm_write_stall_check();
  void on_write_stalled();
  void on_decode_body(std::string_view chunk);
  void on_decode_complete();
  // The decode's answer carries kv_transfer_params that cannot be removed from it
  // (proto/answer_kv_params.h): the answer fails (502, or an error event mid-stream).
  void refuse_kv_params();
  void on_client_gone();
  void count_connection(const UpstreamPort::Call* call);
  // The leg attempt's latency (ProxyCounters::leg_duration), once per attempt: its answer is
  // complete or it failed. A leg pdrouter cancels is not recorded.
  void leg_ended(Leg leg);
  // Passive health (router/routing/ejection.h): a leg's node answered, or could not be connected to.
  void node_answered(Leg leg, const UpstreamPort::Call* call);
  void node_failed(Leg leg, const UpstreamPort::Call* call);
  void relay_upstream_error(int status, const std::string& content_type, const std::string& body);
  void build_and_send();
  void fail(int status, std::string_view message, std::string_view code);
  void end_stream_with_error(int status, std::string_view message, std::string_view code);
  void end(RequestState final_state);
  // At the end: the tenant's tokens settled from the answer's usage, the access log's line.
  void hand_over_record(RequestState final_state);
  void move_to(RequestState next);
  void release_pair();
  void close_legs();
  bool finished() const;

  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace pdr::router::proxy
