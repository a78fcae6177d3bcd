#include "router/proxy/proxy_session.h"

#include "proto/base/log.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "discovery/load_charge.h"
#include "proto/answer_kv_params.h"
#include "proto/anthropic_messages.h"
#include "proto/dialects/dialect.h"
#include "proto/generate_request.h"
#include "proto/json_splice.h"
#include "proto/request_checks.h"
#include "proto/request_legs.h"
#include "proto/responses_legs.h"
#include "proto/responses_stream.h"
#include "proto/sse_boundary.h"
#include "proto/usage_scan.h"
#include "router/clients/access_log.h"
#include "router/http/json_error.h"
#include "router/policies/prompt_tokens.h"
#include "router/proxy/abort_requests.h"
#include "router/proxy/admission.h"
#include "router/proxy/client_api.h"
#include "router/proxy/retry_rules.h"
#include "router/proxy/tenant_tokens.h"

namespace pdr::router::proxy {

using discovery::Instance;

namespace {

// Leg failures repeat per request when a node is down under load: at most a few lines a second
// per worker (proto/base/log_limiter.h); the counters in /metrics see every one.
bool may_log(WorkerContext& w) { return w.leg_log().allow(discovery::Clock::now()); }

proto::LegInstance to_leg_instance(const Instance& i) {
  proto::LegInstance out;
  static_cast<proto::NodeEndpoint&>(out) = i;
  out.dp_size = std::max<uint32_t>(1, i.dp_size);
  out.tp_size = std::max<uint32_t>(1, i.tp_size);
  return out;
}

// SessionTimers: the timers are the session's own (State), and a SessionTimer never calls back
// once destroyed, so their callbacks capture the plain pointer (a weak_ptr capture puts the
// std::function on the heap, and SessionTimer moves it out to run it); each takes a reference for
// its own run, as it may end the session.
//
// KeepAlive: a leg's callbacks keep its session alive while the call may still call back. The
// session is held by UpstreamCallbacks::keep_alive, not by a capture (a std::function stores a
// shared_ptr capture on the heap; a raw pointer fits inline): an upstream port releases a call's
// callbacks and keep_alive together and never while one runs (upstream_port.h), so the
// callbacks capture the plain pointer and take a reference for their own duration (they may end
// the call, which releases its callbacks once they return).

// The upstream request of a leg. Its body is not rendered here: the upstream client writes it
// straight into the wire buffer (UpstreamRequest::append_body, called inside start()), the only
// copy of the body bytes a leg costs (#12); its headers are read from the leg there too
// (UpstreamRequest::borrowed_headers). `leg` must outlive the start() call.
http::UpstreamRequest to_upstream(const proto::LegRequest& leg,
                                  const std::shared_ptr<const http::TlsClientContext>& tls) {
  http::UpstreamRequest r;
  r.tls = tls;  // the node's (node_tls.h); null: plain HTTP
  r.method = "POST";
  r.path = leg.path;
  r.borrowed_headers = leg.headers;
  r.only_content_type = true;  // the session reads no other header of a leg's answer
  const proto::JsonObjectBody* body = &leg.body;
  r.body_size = body->rendered_size();
  r.append_body = [body](std::string* wire) { body->render_into(wire); };
  return r;
}

using SteadyClock = std::chrono::steady_clock;

// Buffers of prefill answers (a serial dialect's prefill JSON is read whole before the decode is
// sent), reused per worker thread: no allocation per request for it once warm. Bounded in number
// and in the size of a buffer kept.
// Set when the thread's spares are destroyed (thread exit): a buffer given later is freed.
thread_local bool answer_spares_gone = false;
struct AnswerSpares {
  static constexpr size_t kMaxBuffers = 256, kMaxBufferBytes = 16 * 1024;
  ~AnswerSpares() { answer_spares_gone = true; }
  std::vector<std::string> buffers;
};
AnswerSpares* answer_spares() {
  if (answer_spares_gone) return nullptr;
  thread_local AnswerSpares spares;
  return &spares;
}
constexpr size_t kInlineStringBytes = 15;  // std::string's inline buffer (no storage of its own)

// An emptied `buffer` gets a spare's storage if it has none of its own.
void take_answer_buffer(std::string& buffer) {
  buffer.clear();
  AnswerSpares* spares = answer_spares();
  if (buffer.capacity() > kInlineStringBytes || spares == nullptr || spares->buffers.empty()) return;
  buffer = std::move(spares->buffers.back());
  spares->buffers.pop_back();
}

// `buffer`'s storage goes to the spares (within the caps) or is freed; it is left empty.
void give_answer_buffer(std::string& buffer) {
  AnswerSpares* spares = answer_spares();
  if (spares != nullptr && buffer.capacity() > kInlineStringBytes &&
      buffer.capacity() <= AnswerSpares::kMaxBufferBytes && spares->buffers.size() < AnswerSpares::kMaxBuffers) {
    buffer.clear();
    spares->buffers.push_back(std::move(buffer));
  }
  std::string().swap(buffer);
}

std::chrono::milliseconds until(SteadyClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

std::string header_value(const std::vector<http::Header>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (pdr::iequals(h.name, name)) return h.value;
  }
  return {};
}

bool is_event_stream(std::string_view content_type) {
  return content_type.size() >= 17 && pdr::iequals(content_type.substr(0, 17), "text/event-stream");
}

// At most 200 bytes of an upstream body, for messages and logs.
std::string excerpt(std::string_view body) {
  std::string out(body.substr(0, 200));
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  if (body.size() > 200) out += "...";
  return out;
}

// Parameters pdrouter can refuse itself before sending any leg (proto/request_checks.h): a
// message for a 400, or nothing. *choices gets n (1 when absent or null). n > 1 cannot go through
// P/D (the prefill leg's KV export and the decode's import are per request, not per sampled
// choice: vLLM's connectors do not transfer KV for parallel sampling), so it goes to the decode
// alone where the dialect allows that (router/routing/decode_alone.h), and is refused after pairing otherwise.
std::optional<std::string> check_parameters(std::string_view path, const proto::JsonObjectBody& body,
                                            int64_t* choices) {
  return proto::check_client_parameters(path, body, choices);
}

// Sends `response`, noting its status and body size for the request's record (hand_over_record).
void send_answer(http::ResponseWriter& writer, http::Response&& response, int* status, uint64_t* bytes) {
  *status = response.status;
  *bytes += response.body.size();
  writer.send(std::move(response));
}

// Streamed tokens in a chunk of a decode's event stream: its data events, [DONE] aside (vLLM
// sends one token per event; an estimate where it batches them or a chunk cuts "data:").
uint64_t streamed_tokens(std::string_view chunk) {
  uint64_t events = 0;
  for (size_t at = chunk.find("data:"); at != std::string_view::npos; at = chunk.find("data:", at + 5)) {
    if (chunk.substr(at + 5, 7) != " [DONE]") ++events;
  }
  return events;
}

tracing::TraceLeg trace_leg(Leg leg) {
  return leg == Leg::kPrefill ? tracing::TraceLeg::kPrefill : tracing::TraceLeg::kDecode;
}

// The error code a client gets for a request that failed on `leg` for `cause`.
std::string_view failure_code(Leg leg, LegFailure cause) {
  if (cause == LegFailure::kLocalResources) return "overloaded";
  if (leg == Leg::kPrefill) return cause == LegFailure::kTimeout ? "prefill_timeout" : "prefill_failed";
  return cause == LegFailure::kTimeout ? "decode_timeout" : "decode_failed";
}

}  // namespace

struct ProxySession::State {
  State(WorkerContext& worker, AdmittedRequest request, http::ResponseWriter response,
        routing::RouteListener& listener)
      : w(worker),
        req(std::move(request)),
        writer(std::move(response)),
        topo(worker.topology()),
        route(worker, worker.shared(), *topo, listener, routed) {}

  WorkerContext& w;
  AdmittedRequest req;
  http::ResponseWriter writer;
  std::shared_ptr<const config::Topology> topo;  // pinned for the whole request
  // The attempt's route, which `route` builds here in place (router/routing/request_route.h):
  // the pair, its DP ranks as routed, the dialect of the pair (proto/dialects/dialect.h), the
  // decode serving alone (decode_alone.h), what the dialect's pre-step learned (pre_step.h), and
  // what this request puts on the pair's nodes (discovery/load_charge.h): a request in flight on
  // each (until release_pair), the decode's sequence and its KV tokens (while its leg runs; and a
  // decode serving alone, its uncached prompt tokens until its first token). Released
  // (release_pair) before the next attempt is asked for.
  routing::Route routed;
  // Where the request goes (router/routing/request_route.h): asked once per attempt, told what
  // happened to the legs.
  routing::RequestRoute route;
  RequestState state = RequestState::kAccepted;
  bool ended = false;

  std::string model;
  int64_t choices = 1;                            // the client's n

  // The DP ranks of the legs sent (the access log's: kept when the pair is released).
  std::optional<uint32_t> prefill_rank, decode_rank;
  // The prefill leg's queued uncached tokens on its node (while that leg runs, an orphan's too).
  discovery::LoadCharge prefill_queue;
  uint64_t decode_events = 0;  // streamed tokens of the decode attempt, and when the first and last came
  SteadyClock::time_point first_event_at{}, last_event_at{};
  // The client's body, parsed once (begin()); admission, affinity and every leg build read it.
  proto::JsonObjectBody client;
  // /inference/v1/generate: the body's check (begin()), which every leg build reads (its
  // sampling_params indexed once; borrows client's document).
  proto::GenerateView generate;
  proto::LegBuild legs;
  uint32_t prefill_attempts = 0, decode_attempts = 0;
  LegFailure last_cause = LegFailure::kConnect;
  Leg last_leg = Leg::kPrefill;
  std::string last_detail;
  // The leg whose failure the attempt being routed retries (counted once a pair is found).
  std::optional<Leg> retry_of;

  UpstreamPort::CallPtr prefill_call;
  std::string prefill_key;  // of the prefill leg in flight (kept after the pair is released)
  int prefill_status = 0;
  std::string prefill_content_type, prefill_body;

  UpstreamPort::CallPtr decode_call;
  int decode_status = 0;
  std::string decode_content_type, decode_body;
  bool sse = false;             // the decode answers an event stream (2xx)
  bool stream_started = false;  // the client's stream head went out: no retry can hide a failure now
  std::string sse_tail;         // bytes of an event not yet complete (or held with the head)
  proto::SseBoundaryScanner sse_scan;  // event boundaries in sse_tail
  bool partial_flushed = false; // a partial event went out (forced flush): an error event needs a new line first
  // POST /v1/responses: what a failure mid-stream needs to end the stream the Responses way
  // (proto/responses_stream.h), learnt from the events relayed.
  std::optional<proto::ResponsesStreamFollower> responses;
  // POST /v1/messages: pdrouter's errors take Anthropic's shape (proto/anthropic_messages.h).
  bool anthropic = false;
  bool paused = false;          // decode reads paused for back-pressure
  size_t stall_mark = 0;        // client bytes queued when the write-stall check was armed
  SteadyClock::time_point decode_sent_at{};
  SteadyClock::time_point prefill_sent_at{};
  SteadyClock::time_point prefill_deadline{};
  PdPhaseClock phases;          // this attempt's P/D phase times (pd_phases.h)
  bool prefill_timed = false;   // the prefill attempt in flight is not yet in leg_duration
  bool decode_timed = false;    // the decode attempt in flight is not yet in leg_duration
  bool orphan = false;          // counted in orphan_legs.open: the prefill leg outlives the request
  uint64_t orphan_id = 0;       // its entry in the worker's OrphanLegs (orphan_legs.h)
  int64_t budget_held = 0;      // bytes of limits.max_buffered_bytes this request holds (body + answer)
  int64_t answer_budget = 0;    // of which the buffered decode answer's
  // What the request's end hands on (hand_over_record): to the tenant's token bucket, the answer's
  // usage (read only when the tenant limits tokens or the access log is on); to the access log,
  // the rest.
  bool want_usage = false;
  proto::TokenUsage usage;
  int client_status = 0;        // the status the client got (a stream: the one it started with)
  uint64_t bytes_out = 0;       // answer body bytes handed to the client
  uint32_t retries = 0;
  std::optional<SteadyClock::time_point> first_byte_at;
  std::string decode_key;       // of the decode leg last sent (access log only)

  // Declared last: destroyed (closed) first, before anything their callbacks read.
  SessionTimer stall_timer;    // client write stall (timeouts.client_write)
  SessionTimer prefill_timer;  // whole prefill leg (timeouts.prefill), then the orphan's grace
  SessionTimer head_timer;     // a held stream head: the first event is due (timeouts.first_byte)
  SessionTimer request_timer;  // whole request (timeouts.request, 0 = none)
};

void ProxySession::start(WorkerContext& worker, AdmittedRequest request, http::ResponseWriter writer) {
  auto session = std::make_shared<ProxySession>(worker, std::move(request), std::move(writer));
  std::weak_ptr<ProxySession> weak = session;
  session->s_->writer.on_client_close([weak] {
    if (auto self = weak.lock()) self->on_client_gone();
  });
  session->begin();
}

ProxySession::ProxySession(WorkerContext& worker, AdmittedRequest request, http::ResponseWriter writer)
    : s_(std::make_unique<State>(worker, std::move(request), std::move(writer),
                                 static_cast<routing::RouteListener&>(*this))) {
  s_->budget_held = static_cast<int64_t>(s_->req.budget_bytes);
  if (s_->req.path == proto::kResponsesPath) s_->responses.emplace();
  s_->anthropic = proto::is_anthropic_path(s_->req.path);
  if (s_->req.arrived_at == SteadyClock::time_point{}) s_->req.arrived_at = SteadyClock::now();
}

ProxySession::~ProxySession() {
  // Every path ends through end(); this only guards against a bug leaving counts behind.
  if (!s_->ended) {
    close_legs();
    release_pair();
    give_back_slot(s_->w.shared());  // the head waiter gets it (admission.h)
  }
  orphan_done();
  // The request body and any buffered answer are freed with the session.
  if (s_->budget_held != 0) s_->w.counters().buffered.release(s_->budget_held);
}

bool ProxySession::finished() const { return s_->ended; }

void ProxySession::move_to(RequestState next) {
  s_->w.counters().transition(s_->state, next);
  s_->state = next;
}

void ProxySession::begin() {
  State& s = *s_;
  if (finished()) return;  // the client was already gone
  proto::JsonLimits limits;
  limits.max_bytes = s.topo->limits.max_body_bytes;
  // The one parse of the client's body: it moves into s.client (no copy of its bytes).
  Status st = proto::JsonObjectBody::parse_owned(std::move(s.req.body), limits, &s.client);
  const proto::JsonObjectBody& body = s.client;
  if (st.is_ok()) {
    std::optional<std::string> model;
    st = body.get_string("model", &model);
    if (st.is_ok() && model) s.model = std::move(*model);
    if (s.req.trace) s.req.trace->model(s.model);
  }
  if (!st.is_ok()) {
    s.w.counters().refuse(Refusal::kBadJson);
    send_answer(s.writer, api_error_response(s.req.path, 400, st.message(), "invalid_request_error", "invalid_json"),
                &s.client_status, &s.bytes_out);
    end(RequestState::kFailed);
    return;
  }
  if (s.req.path == proto::kGeneratePath) {
    // Tokens in: token_ids and sampling_params, with the token counts inside the latter.
    if (Status checked = proto::check_generate_request(body, limits, &s.generate); !checked.is_ok()) {
      s.w.counters().refuse(Refusal::kBadParameter);
      send_answer(s.writer, api_error_response(s.req.path, 400, checked.message(), "invalid_request_error", "invalid_parameter"),
                &s.client_status, &s.bytes_out);
      end(RequestState::kFailed);
      return;
    }
    s.choices = s.generate.choices;
  } else if (s.anthropic) {
    // Anthropic's Messages API: its required fields; it has no `n` (one choice).
    if (Status checked = proto::check_messages_request(body); !checked.is_ok()) {
      s.w.counters().refuse(Refusal::kBadParameter);
      send_answer(s.writer, api_error_response(s.req.path, 400, checked.message(), "invalid_request_error", "invalid_parameter"),
                &s.client_status, &s.bytes_out);
      end(RequestState::kFailed);
      return;
    }
  } else if (auto refusal = check_parameters(s.req.path, body, &s.choices)) {
    s.w.counters().refuse(Refusal::kBadParameter);
    send_answer(s.writer, api_error_response(s.req.path, 400, *refusal, "invalid_request_error", "invalid_parameter"),
                &s.client_status, &s.bytes_out);
    end(RequestState::kFailed);
    return;
  }
  routing::RequestFacts facts;
  facts.body = &s.client;
  facts.model = s.model;
  facts.path = s.req.path;
  facts.choices = s.choices;
  facts.authorization = s.req.authorization;
  facts.bind_header_value = s.req.bind_header_value;
  facts.session_header_value = s.req.session_header_value;
  facts.affinity_header_value = s.req.affinity_header_value;
  facts.forwarded_authorization = s.req.forward_authorization ? std::string_view(s.req.authorization) : "";
  facts.slo = s.req.slo;
  if (auto refusal = s.route.begin(facts)) {
    s.w.counters().refuse(Refusal::kBadParameter);
    send_answer(s.writer, api_error_response(s.req.path, 400, *refusal, "invalid_request_error", "invalid_parameter"),
                &s.client_status, &s.bytes_out);
    end(RequestState::kFailed);
    return;
  }
  s.want_usage = s.req.ticket.limits_tokens() || s.req.log_record != nullptr;
  if (s.req.ticket.limits_tokens()) {
    // tokens_per_minute: the prompt and the answer's cap are reserved now, settled at the end.
    const uint64_t tokens =
        requested_tokens(body, s.req.path == proto::kGeneratePath ? &s.generate : nullptr, s.choices);
    clients::TenantRefusal why{};
    double wait = 0;
    if (!s.req.ticket.reserve(tokens, SteadyClock::now(), &why, &wait)) {
      send_answer(s.writer, tenant_tokens_refusal(s.req.path, s.req.tenant, tokens, why, wait, *s.topo),
                  &s.client_status, &s.bytes_out);
      end(RequestState::kFailed);
      return;
    }
  }
  if (s.topo->timeouts.request.count() > 0) {
    s.request_timer.start(s.w.timers(), s.topo->timeouts.request, [this] {  // see SessionTimers
      shared_from_this()->on_request_deadline();
    });
  }
  pair_and_send();
}

void ProxySession::on_request_deadline() {
  State& s = *s_;
  if (finished()) return;
  s.w.counters().bump(s.w.counters().request_deadlines);
  if (may_log(s.w)) {
    pdr::log::warn("request {}: still running at timeouts.request_ms = {} ms; ended", s.legs.plan.request_id,
                 s.topo->timeouts.request.count());
  }
  close_legs();
  fail(504, "the request took longer than timeouts.request_ms = " + std::to_string(s.topo->timeouts.request.count()) +
                " ms",
       "request_deadline");
}

void ProxySession::pair_and_send(std::optional<Leg> retry_of) {
  State& s = *s_;
  s.retry_of = retry_of;
  // The route holds the session (keep_alive()) while it waits (the /tokenize call, the SLO gate,
  // the pre-step); it calls back once, possibly before route() returns.
  s.route.route(s.prefill_attempts != 0);
}

void ProxySession::on_paired(const routing::Pair& pair) {
  State& s = *s_;
  if (s.retry_of) {
    s.w.counters().retried(*s.retry_of);
    ++s.retries;
  }
  if (s.req.trace) s.req.trace->routed(pair.prefill->key, pair.decode->key, s.route.cache_hits());
}

std::shared_ptr<void> ProxySession::keep_alive() { return shared_from_this(); }

void ProxySession::on_routed(routing::Route* route, routing::RouteRefusal* refusal) {
  State& s = *s_;
  if (finished()) {  // (end() cancels the route first) a pair handed over goes back
    release_pair();
    return;
  }
  if (refusal != nullptr) {
    using Why = routing::RouteRefusalReason;
    switch (refusal->reason) {
      case Why::kNoPair:
        if (s.prefill_attempts == 0) {
          s.w.counters().refuse(Refusal::kNoPair);
          fail(503, "no prefill/decode pair available: " + refusal->message, "no_pair");
        } else {
          fail(failure_status(s.last_cause),
               std::string(s.last_leg == Leg::kPrefill ? "prefill" : "decode") + " failed: " + s.last_detail +
                   "; no node left to retry on: " + refusal->message,
               failure_code(s.last_leg, s.last_cause));
        }
        return;
      case Why::kNotSupported: s.w.counters().refuse(Refusal::kNoPair); break;
      case Why::kBadParameter: s.w.counters().refuse(Refusal::kBadParameter); break;
      case Why::kSloUnmet: s.w.counters().refuse(Refusal::kSloUnmet); break;
      case Why::kQueueTimeout: s.w.counters().refuse(Refusal::kQueueTimeout); break;
      case Why::kShuttingDown: s.w.counters().refuse(Refusal::kShuttingDown); break;
    }
    fail(refusal->status, refusal->message, refusal->code);
    return;
  }
  // `route` is s.routed, built in place: nothing to move out of it.
  s.prefill_rank = route->prefill_rank;
  s.decode_rank = route->decode_rank;
  if (!route->pre_step.is_ok()) {
    prefill_failed(LegFailure::kBootstrap, route->pre_step.message());
    return;
  }
  build_and_send();
}

void ProxySession::build_and_send() {
  State& s = *s_;
  proto::LegInstance prefill = to_leg_instance(*s.routed.pair.prefill);
  proto::LegInstance decode = to_leg_instance(*s.routed.pair.decode);
  prefill.mooncake_engine_id = s.routed.prefill_facts.engine_id;
  if (s.routed.prefill_facts.dp_size != 0) prefill.dp_size = s.routed.prefill_facts.dp_size;
  proto::LegOptions options;
  options.limits.max_bytes = s.topo->limits.max_body_bytes;
  options.default_bootstrap_port = s.topo->connectors.mooncake_bootstrap_port;
  // The configured key wins over the client's header, as in the reference proxies: OpenAI SDK
  // clients always send one (often "Bearer EMPTY"), which nodes behind --api-key would refuse.
  if (!s.topo->connectors.upstream_api_key.empty()) {
    options.upstream_api_key = s.topo->connectors.upstream_api_key;
  }
  options.forward_client_authorization = s.req.forward_authorization;  // not a client key for pdrouter
  proto::ClientRequest client{s.req.path, s.client.original(), s.req.authorization, &s.client, &s.generate};
  WorkerContext& w = s.w;
  Status st = proto::build_legs(client, prefill, decode, s.prefill_rank, s.decode_rank, options,
                                [&w] { return w.random(); }, &s.legs);
  if (!st.is_ok()) {
    if (st.code() == StatusCode::kRejected || st.code() == StatusCode::kOutOfRange) {
      s.w.counters().refuse(Refusal::kNoPair);
      fail(503,
           "cannot pair prefill " + s.routed.pair.prefill->key + " with decode " + s.routed.pair.decode->key +
               ": " + st.message(),
           "no_pair");
    } else {
      s.w.counters().refuse(Refusal::kBadJson);
      fail(400, st.message(), "invalid_request");
    }
    return;
  }
  s.route.legs_built(s.legs, *s.routed.pair.decode, s.legs.plan.request_id);
  if (s.route.multi_turn()) {
    if (s.legs.plan.tokens_in) {  // the prefill may have got the decode's params at the top level
      (void)proto::mirror_generate_kv_params(options.limits, &s.legs.prefill.body);
      (void)proto::mirror_generate_kv_params(options.limits, &s.legs.decode.body);
    }
  }
  move_to(RequestState::kPaired);
  if (s.routed.decode_alone) {
    // No prefill leg: the decode gets the dialect's plain request and computes the prompt. The
    // prefill the pair named is released at once (it carries no load of this request).
    proto::decode_without_kv(s.legs.plan, &s.legs.decode);
    s.w.counters().bump(s.w.counters().decode_alone[static_cast<size_t>(*s.routed.decode_alone)]);
    s.routed.prefill_load.release();
    s.routed.pair.prefill.reset();
    s.phases = PdPhaseClock();  // not P/D: no phase observed
    send_decode();
    return;
  }
  send_prefill();
  if (!finished() && s.legs.plan.concurrent) send_decode();
}

void ProxySession::send_prefill() {
  State& s = *s_;
  ++s.prefill_attempts;
  s.prefill_key = s.routed.pair.prefill->key;
  s.prefill_status = 0;
  s.prefill_content_type.clear();
  take_answer_buffer(s.prefill_body);
  http::UpstreamTimeouts timeouts{s.topo->timeouts.connect, s.topo->timeouts.prefill, s.topo->timeouts.prefill};
  auto self = shared_from_this();
  ProxySession* session = this;  // see KeepAlive
  http::UpstreamCallbacks cb;
  cb.on_head = [session](int status, const std::vector<http::Header>& headers) {
    const auto self = session->shared_from_this();
    self->node_answered(Leg::kPrefill, self->s_->prefill_call.get());
    self->s_->prefill_status = status;
    if (self->s_->req.trace) self->s_->req.trace->leg_answered(tracing::TraceLeg::kPrefill, status);
    // Only an error answer is relayed (relay_upstream_error): a 2xx one's type is not kept.
    if (status < 200 || status >= 300) self->s_->prefill_content_type = header_value(headers, "Content-Type");
  };
  cb.on_body = [session](std::string_view chunk) {
    const auto self = session->shared_from_this();
    State& s = *self->s_;
    // A concurrent dialect's prefill answer is only read for its status and an error excerpt;
    // once the request ended or the decode streams nobody reads it at all: dropped as it
    // arrives, so a prefill answering a huge or endless body costs no memory.
    const bool concurrent = s.legs.plan.concurrent;
    const size_t cap = concurrent ? kMaxErrorAnswer : kMaxPrefillAnswer;
    const bool unread = self->finished() || (concurrent && s.state == RequestState::kStreaming);
    if (!unread && s.prefill_body.size() + chunk.size() <= cap) {
      s.prefill_body.append(chunk);
    } else if (!unread && !concurrent) {
      self->prefill_failed(LegFailure::kBadResponse, "prefill " + s.routed.pair.prefill->key + " answer is over " +
                                                         std::to_string(kMaxPrefillAnswer) + " bytes");
    } else {
      s.w.counters().prefill_bytes_discarded.fetch_add(chunk.size(), std::memory_order_relaxed);
    }
  };
  cb.on_complete = [session] { session->shared_from_this()->on_prefill_complete(); };
  cb.keep_alive = self;  // see KeepAlive
  cb.on_error = [session](const Status& error) {
    const auto self = session->shared_from_this();
    State& s = *self->s_;
    self->leg_ended(Leg::kPrefill);
    if (self->finished()) {  // a concurrent prefill outliving its answered request
      if (may_log(s.w)) {
        pdr::log::warn("request {}: prefill {} failed after the answer was complete: {}", s.legs.plan.request_id,
                     s.prefill_key, error.message());
      }
      s.prefill_call.reset();
      s.prefill_queue.release();
      s.prefill_timer.stop();
      self->orphan_done();
      return;
    }
    self->node_failed(Leg::kPrefill, s.prefill_call.get());
    const LegFailure cause = s.prefill_call ? classify(s.prefill_call->failure()) : LegFailure::kConnectionLost;
    self->prefill_failed(cause, "prefill " + s.routed.pair.prefill->key + ": " + error.message());
  };
  move_to(RequestState::kPrefillSent);
  const SteadyClock::time_point sent_at = SteadyClock::now();
  s.prefill_sent_at = sent_at;
  s.phases.prefill_sent(sent_at);
  s.prefill_timed = true;
  s.prefill_queue = discovery::LoadCharge(*s.routed.pair.prefill, s.prefill_rank, /*request=*/false);
  s.prefill_queue.queue_prefill(uncached_tokens(s.route.prompt(), s.route.cache_hits(), s.routed.pair.prefill->key));
  if (s.req.trace) {
    s.req.trace->leg_started(tracing::TraceLeg::kPrefill, s.routed.pair.prefill->http_address, s.legs.prefill.path,
                             s.w.node_tls(s.routed.pair.prefill->http_address) != nullptr, &s.legs.prefill.headers);
  }
  s.prefill_call = s.w.upstream().start(s.routed.pair.prefill->http_address,
                                       to_upstream(s.legs.prefill, s.w.node_tls(s.routed.pair.prefill->http_address)),
                                       timeouts, std::move(cb));
  // timeouts.prefill bounds the whole leg, not only its first byte and silences: a prefill
  // trickling bytes is cut there too.
  s.prefill_deadline = sent_at + s.topo->timeouts.prefill;
  s.prefill_timer.start(s.w.timers(), s.topo->timeouts.prefill, [this] {  // see SessionTimers
    shared_from_this()->on_prefill_deadline();
  });
}

void ProxySession::on_prefill_deadline() {
  State& s = *s_;
  if (!s.prefill_call) return;
  if (finished()) {  // an orphan (end()): its grace period or its deadline is over
    close_orphan();
    return;
  }
  s.w.counters().bump(s.w.counters().prefill_deadlines);
  prefill_failed(LegFailure::kTimeout, "prefill " + s.prefill_key +
                                           ": no complete answer within timeouts.prefill_ms = " +
                                           std::to_string(s.topo->timeouts.prefill.count()) + " ms");
}

void ProxySession::close_orphan() {
  State& s = *s_;
  s.prefill_timer.stop();
  if (s.prefill_call) {
    s.prefill_call->cancel();
    s.prefill_call.reset();
    s.w.counters().bump(s.w.counters().orphan_legs.closed);
  }
  s.prefill_queue.release();
  orphan_done();
}

void ProxySession::orphan_done() {
  State& s = *s_;
  if (!s.orphan) return;
  s.orphan = false;
  s.w.counters().orphan_legs.open.fetch_sub(1, std::memory_order_relaxed);
  s.w.orphans().remove(s.prefill_key, s.orphan_id);
}

void ProxySession::on_prefill_complete() {
  State& s = *s_;
  leg_ended(Leg::kPrefill);
  s.prefill_call.reset();
  s.prefill_timer.stop();
  orphan_done();
  const int status = s.prefill_status;
  if (status >= 200 && status < 300) {
    const SteadyClock::time_point now = SteadyClock::now();
    s.phases.prefill_answered(s.legs.plan.dialect, s.w.counters().pd_phases, now);
    const double seconds = std::chrono::duration<double>(now - s.prefill_sent_at).count();
    s.prefill_queue.prefill_done();  // answered: the node's busy clock takes its tokens (load_ledger.h)
    s.route.prefill_answered(seconds);
  }
  s.prefill_queue.release();
  s.w.shared().slo_gate.wake();  // its queued tokens are off the node: waiting SLOs may be met now
  if (finished() || (s.legs.plan.concurrent && s.state == RequestState::kStreaming)) {
    // The decode already answers the client, so its KV arrived; a late prefill error changes
    // nothing but is worth a log line (docs/design/wire-formats.md rule 8).
    if (status < 200 || status >= 300) {
      if (may_log(s.w)) {
        pdr::log::warn("request {}: prefill {} answered {} after the decode started: {}", s.legs.plan.request_id,
                     s.prefill_key, status, excerpt(s.prefill_body));
      }
    }
    return;
  }
  if (status >= 200 && status < 300) {
    if (s.legs.plan.concurrent) return;  // the decode leg is already running; answer dropped
    move_to(RequestState::kPrefillDone);
    if (s.legs.plan.decode_needs_prefill_params) {
      Status st = proto::finish_decode_leg(s.legs.plan, &s.legs.decode, s.prefill_body);
      if (st.code() == StatusCode::kMissingKey && proto::decode_without_kv(s.legs.plan, &s.legs.decode)) {
        // The prefill exported no KV (it stopped before the length cap, e.g. EOS on its first
        // token). A decode waiting for remote blocks would hang: the dialect's no-KV fallback
        // sends it as a plain request.
        s.w.counters().bump(s.w.counters().local_prefill_fallbacks);
        pdr::log::info("request {}: prefill {} exported no KV ({}); decode recomputes the prompt",
                     s.legs.plan.request_id, s.routed.pair.prefill->key, st.message());
      } else if (!st.is_ok()) {
        prefill_failed(LegFailure::kBadResponse, "prefill " + s.routed.pair.prefill->key + " answer: " + st.message());
        return;
      }
    }
    send_decode();
    return;
  }
  const LegFailure cause = classify_status(status);
  if (cause == LegFailure::kStatus4xx) {
    // The node refused the request itself (bad parameters, unknown model, ...): the client
    // gets the node's answer, as from a single vLLM server.
    s.w.counters().leg_failed(Leg::kPrefill, cause);
    close_legs();
    relay_upstream_error(status, s.prefill_content_type, s.prefill_body);
    return;
  }
  prefill_failed(cause, "prefill " + s.routed.pair.prefill->key + " answered " + std::to_string(status) + ": " +
                            excerpt(s.prefill_body));
}

void ProxySession::prefill_failed(LegFailure cause, std::string detail) {
  State& s = *s_;
  if (finished()) return;
  if (s.req.trace) s.req.trace->leg_failed(tracing::TraceLeg::kPrefill, to_string(cause));
  leg_ended(Leg::kPrefill);
  s.w.counters().leg_failed(Leg::kPrefill, cause);
  if (s.prefill_call) {
    s.prefill_call->cancel();
    s.prefill_call.reset();
  }
  s.prefill_queue.release();
  s.prefill_timer.stop();
  if (s.routed.pair.prefill && s.routed.dialect) s.route.prefill_failed(*s.routed.dialect, *s.routed.pair.prefill);
  if (s.state == RequestState::kStreaming) {
    // Concurrent dialect whose decode already answered: its KV arrived; nothing to undo.
    if (may_log(s.w)) pdr::log::warn("request {}: {} (decode already streaming)", s.legs.plan.request_id, detail);
    return;
  }
  if (may_log(s.w)) pdr::log::warn("request {}: {}", s.legs.plan.request_id, detail);
  if (s.decode_call) {  // concurrent dialects: the decode waits for KV that will not come
    if (s.routed.pair.decode) abort_leg_on_node(s.w, *s.routed.pair.decode, s.req.path, s.legs.plan.request_id);
    s.decode_call->cancel();
    s.decode_call.reset();
  }
  s.last_cause = cause;
  s.last_leg = Leg::kPrefill;
  s.last_detail = std::move(detail);
  const uint32_t budget = std::max<uint32_t>(1, s.topo->retries.prefill_attempts);
  const uint32_t left = budget > s.prefill_attempts ? budget - s.prefill_attempts : 0;
  if (s.routed.pair.prefill) s.route.exclude(proto::Role::kPrefill, s.routed.pair.prefill->key);
  if (!prefill_retryable(cause, left)) {
    fail(failure_status(cause), "prefill failed: " + s.last_detail, failure_code(Leg::kPrefill, cause));
    return;
  }
  release_pair();
  pair_and_send(Leg::kPrefill);
}

void ProxySession::send_decode() {
  State& s = *s_;
  ++s.decode_attempts;
  s.decode_status = 0;
  s.decode_content_type.clear();
  release_answer_budget();
  s.decode_body.clear();
  s.sse = false;
  s.sse_tail.clear();
  s.sse_scan.reset();
  s.partial_flushed = false;
  s.paused = false;
  s.stall_timer.stop();
  s.head_timer.stop();
  s.decode_sent_at = SteadyClock::now();
  s.phases.decode_sent(s.decode_sent_at);
  s.decode_timed = true;
  // The decode holds the whole prompt's KV (sent or computed), then what it generates; serving
  // alone, it also computes the prompt: queued prefill tokens on it until its first token.
  s.routed.decode_load.decode_done();
  s.routed.decode_load.prefill_done();
  s.routed.decode_load.start_decode(s.route.prompt().count);
  if (s.routed.decode_alone) {
    s.routed.decode_load.queue_prefill(
        uncached_tokens(s.route.prompt(), s.route.cache_hits(), s.routed.pair.decode->key));
  }
  s.decode_events = 0;
  http::UpstreamTimeouts timeouts{s.topo->timeouts.connect, s.topo->timeouts.first_byte,
                                  s.topo->timeouts.stream_idle};
  auto self = shared_from_this();
  ProxySession* session = this;  // see KeepAlive
  http::UpstreamCallbacks cb;
  cb.on_head = [session](int status, const std::vector<http::Header>& headers) {
    const auto self = session->shared_from_this();
    self->node_answered(Leg::kDecode, self->s_->decode_call.get());
    self->on_decode_head(status, headers);
  };
  cb.on_body = [session](std::string_view chunk) { session->shared_from_this()->on_decode_body(chunk); };
  cb.on_complete = [session] { session->shared_from_this()->on_decode_complete(); };
  cb.keep_alive = self;  // see KeepAlive
  cb.on_error = [session](const Status& error) {
    const auto self = session->shared_from_this();
    State& s = *self->s_;
    if (self->finished()) return;
    self->leg_ended(Leg::kDecode);
    self->node_failed(Leg::kDecode, s.decode_call.get());
    const LegFailure cause = s.decode_call ? classify(s.decode_call->failure()) : LegFailure::kConnectionLost;
    const std::string detail = "decode " + s.routed.pair.decode->key + ": " + error.message();
    if (s.stream_started || s.state == RequestState::kStreaming) {
      // The answer already started reaching the client: no retry can hide this.
      s.w.counters().leg_failed(Leg::kDecode, cause);
      if (may_log(s.w)) pdr::log::warn("request {}: {} (mid-answer)", s.legs.plan.request_id, detail);
      s.decode_call.reset();
      self->fail(failure_status(cause), detail + " (the answer was cut short)", failure_code(Leg::kDecode, cause));
      return;
    }
    self->decode_failed(cause, detail);
  };
  move_to(RequestState::kDecodeSent);
  if (s.req.log_record) s.decode_key = s.routed.pair.decode->key;
  // The leg stays as it is (unrendered): a kDecodeOnly retry resends it to another decode.
  if (s.req.trace) {
    s.req.trace->leg_started(tracing::TraceLeg::kDecode, s.routed.pair.decode->http_address, s.legs.decode.path,
                             s.w.node_tls(s.routed.pair.decode->http_address) != nullptr, &s.legs.decode.headers);
  }
  s.decode_call = s.w.upstream().start(s.routed.pair.decode->http_address,
                                      to_upstream(s.legs.decode, s.w.node_tls(s.routed.pair.decode->http_address)),
                                      timeouts, std::move(cb));
}

void ProxySession::leg_ended(Leg leg) {
  State& s = *s_;
  bool& open = leg == Leg::kPrefill ? s.prefill_timed : s.decode_timed;
  if (!open) return;
  open = false;
  if (s.req.trace) s.req.trace->leg_ended(trace_leg(leg));
  const SteadyClock::time_point sent_at = leg == Leg::kPrefill ? s.prefill_sent_at : s.decode_sent_at;
  s.w.counters().leg_duration[static_cast<size_t>(leg)].record(SteadyClock::now() - sent_at);
}

void ProxySession::count_connection(const UpstreamPort::Call* call) {
  if (call == nullptr) return;
  s_->w.counters().upstream_legs.answered(call->reused_connection());
}

void ProxySession::node_answered(Leg leg, const UpstreamPort::Call* call) {
  count_connection(call);
  const InstancePtr& node = leg == Leg::kPrefill ? s_->routed.pair.prefill : s_->routed.pair.decode;
  if (node) s_->route.node_answered(*node);
}

void ProxySession::node_failed(Leg leg, const UpstreamPort::Call* call) {
  const InstancePtr& node = leg == Leg::kPrefill ? s_->routed.pair.prefill : s_->routed.pair.decode;
  if (call == nullptr || !node) return;
  EjectionRule rule;
  if (s_->route.node_unreachable(*node, call->failure(), &rule)) {
    s_->w.counters().ejected(leg);
    pdr::log::warn("{} {} ejected for {} ms: {} legs in a row could not connect to it", to_string(leg), node->key,
                 rule.duration.count(), rule.after);
  }
}

void ProxySession::on_decode_head(int status, const std::vector<http::Header>& headers) {
  State& s = *s_;
  if (finished()) return;
  if (s.req.trace) s.req.trace->leg_answered(tracing::TraceLeg::kDecode, status);
  s.decode_status = status;
  s.decode_content_type = header_value(headers, "Content-Type");
  if (status < 200 || status >= 300) return;  // body collected, judged on completion
  if (!is_event_stream(s.decode_content_type)) {
    move_to(RequestState::kStreaming);
    return;  // JSON: relayed whole on completion
  }
  // vLLM sends a stream's head at once, before its first token (a decode waiting for KV from a
  // hung prefill has sent it too). The client's head is held until the first data event, so
  // that a decode failing or going silent before it can still be retried; the
  // first event is due within what is left of timeouts.first_byte.
  s.sse = true;
  s.w.counters().bump(s.w.counters().held_stream_heads);
  const auto due = s.decode_sent_at + s.topo->timeouts.first_byte;
  s.head_timer.start(s.w.timers(), until(due), [this] {  // see SessionTimers
    auto self = shared_from_this();
    if (self->finished() || self->s_->stream_started || !self->s_->decode_call) return;
    State& st = *self->s_;
    self->decode_failed(LegFailure::kTimeout, "decode " + st.routed.pair.decode->key +
                                                  ": stream head but no event within timeouts.first_byte_ms = " +
                                                  std::to_string(st.topo->timeouts.first_byte.count()) + " ms");
  });
}

bool ProxySession::start_client_stream() {
  State& s = *s_;
  s.head_timer.stop();
  move_to(RequestState::kStreaming);
  s.stream_started = true;
  // Built in place (an initializer list would copy every string): the content type moves, as
  // nothing reads it once the stream is the client's (no retry after this point).
  std::vector<http::Header> out;
  out.reserve(3);
  out.push_back({"Content-Type", std::move(s.decode_content_type)});
  out.push_back({"X-Request-Id", s.legs.plan.request_id});
  out.push_back({"Cache-Control", "no-cache"});
  if (s.req.trace) s.req.trace->response_status(s.decode_status);
  if (!s.writer.start_stream(s.decode_status, std::move(out))) {
    on_client_gone();
    return false;
  }
  // The client's first answer bytes (the head with the first data event, written right after).
  s.client_status = s.decode_status;
  s.first_byte_at = SteadyClock::now();
  s.w.counters().time_to_first_byte.record(*s.first_byte_at - s.req.arrived_at);
  return true;
}

void ProxySession::on_decode_body(std::string_view chunk) {
  State& s = *s_;
  if (finished()) return;
  if (s.decode_status >= 200 && s.decode_status < 300) {
    s.phases.decode_bytes(s.legs.plan.dialect, s.sse, s.w.counters().pd_phases, SteadyClock::now());
  }
  if (s.sse && s.decode_status >= 200 && s.decode_status < 300) {
    if (const uint64_t tokens = streamed_tokens(chunk); tokens != 0) {
      s.routed.decode_load.prefill_done();  // a decode serving alone computed the prompt
      s.routed.decode_load.add_kv_tokens(tokens);
      s.last_event_at = SteadyClock::now();
      if (s.decode_events == 0) s.first_event_at = s.last_event_at;
      s.decode_events += tokens;
    }
  }
  if (s.sse) {
    // Relay whole events only, holding back a partial one, so that an error event added after a
    // failure never lands inside an event (and clients never see half an event first). Event
    // boundaries are any blank line ("\n\n", "\r\r", "\r\n\r\n": proto/sse_boundary.h).
    s.route.decode_bytes(chunk);
    std::string_view out = chunk;
    size_t from_tail = 0;  // bytes of sse_tail in `out`, dropped from it once written
    const bool continues_event = s.partial_flushed;  // the last write ended inside an event
    bool forced = false;
    if (!s.stream_started || !s.sse_tail.empty() || chunk.size() < 2 || chunk.substr(chunk.size() - 2) != "\n\n") {
      s.sse_tail.append(chunk);
      size_t cut = s.sse_scan.scan(s.sse_tail);
      if (!s.stream_started) {
        const bool first_event = cut != 0 && proto::sse_has_data_field(std::string_view(s.sse_tail).substr(0, cut));
        if (!first_event && s.sse_tail.size() < kMaxPartialEvent) return;  // head still held
        if (!start_client_stream()) return;
      }
      forced = cut == 0;
      if (forced && s.sse_tail.size() < kMaxPartialEvent) return;
      if (forced) {
        // One event goes out in parts. Node-internal kv_transfer_params can only be removed
        // from a whole event, so an event carrying them is refused; the last bytes are held
        // back, so a key cut here is seen whole in the next part's check.
        if (proto::carries_kv_params(s.sse_tail)) {
          refuse_kv_params();
          return;
        }
        cut = s.sse_tail.size() - (proto::kKvParamsKeyBytes - 1);
      }
      s.partial_flushed = forced;
      from_tail = cut;
      out = std::string_view(s.sse_tail).substr(0, cut);  // the writer copies it (no scratch copy)
    } else {
      s.sse_scan.at_boundary();
      s.partial_flushed = false;
    }
    // The decode's kv_transfer_params never reach the client (multi_turn read them above).
    std::string redacted;
    if (!forced) {
      const proto::KvParamsEdit edit = proto::redact_kv_params_events(out, continues_event, &redacted);
      if (edit == proto::KvParamsEdit::kRefused) {
        s.partial_flushed = continues_event;  // none of `out` went out
        refuse_kv_params();
        return;
      }
      if (edit == proto::KvParamsEdit::kRedacted) out = redacted;
    }
    const bool written = s.writer.write(out);
    s.bytes_out += out.size();
    if (s.want_usage) proto::scan_usage(out, &s.usage);
    if (s.responses) s.responses->observe(out);
    if (s.req.trace) s.req.trace->answer_bytes(out);
    if (from_tail != 0) {
      s.sse_tail.erase(0, from_tail);
      s.sse_scan.consumed(from_tail);
    }
    if (!written) {
      on_client_gone();
      return;
    }
    if (!s.paused && s.writer.buffered_bytes() >= kHighWater && s.decode_call) {
      s.paused = true;
      s.decode_call->pause();
      s.w.counters().bump(s.w.counters().backpressure_pauses);
      std::weak_ptr<ProxySession> weak = weak_from_this();
      s.writer.on_drain([weak] {
        auto self = weak.lock();
        if (!self || self->finished()) return;
        self->s_->paused = false;
        self->s_->stall_timer.stop();
        if (self->s_->decode_call) self->s_->decode_call->resume();
      });
      arm_write_stall_check();
    }
    return;
  }
  const bool ok_status = s.decode_status >= 200 && s.decode_status < 300;
  const size_t cap = ok_status ? kMaxBufferedAnswer : kMaxErrorAnswer;
  if (s.decode_body.size() + chunk.size() > cap) {
    if (!ok_status) return;  // enough of the error to relay; the rest is dropped
    leg_ended(Leg::kDecode);
    s.w.counters().leg_failed(Leg::kDecode, LegFailure::kBadResponse);
    fail(502, "decode " + s.routed.pair.decode->key + " answer is over " + std::to_string(cap) + " bytes",
         "decode_failed");
    return;
  }
  if (ok_status && !reserve_answer_budget(chunk.size())) {
    s.w.counters().bump(s.w.counters().buffered.answers_over_budget);
    if (may_log(s.w)) {
      pdr::log::warn("request {}: decode answer not buffered: limits.max_buffered_bytes = {} reached",
                   s.legs.plan.request_id, s.topo->limits.max_buffered_bytes);
    }
    fail(503,
         "pdrouter is holding too many buffered bytes (limits.max_buffered_bytes = " +
             std::to_string(s.topo->limits.max_buffered_bytes) + "); retry later or use stream: true",
         "memory_budget");
    return;
  }
  s.decode_body.append(chunk);
}

bool ProxySession::reserve_answer_budget(size_t bytes) {
  State& s = *s_;
  if (!s.w.counters().buffered.reserve(bytes, s.topo->limits.max_buffered_bytes)) return false;
  s.answer_budget += static_cast<int64_t>(bytes);
  s.budget_held += static_cast<int64_t>(bytes);
  return true;
}

void ProxySession::release_answer_budget() {
  State& s = *s_;
  if (s.answer_budget == 0) return;
  s.w.counters().buffered.release(s.answer_budget);
  s.budget_held -= s.answer_budget;
  s.answer_budget = 0;
}

void ProxySession::arm_write_stall_check() {
  State& s = *s_;
  s.stall_mark = s.writer.buffered_bytes();
  s.stall_timer.start(s.w.timers(), s.topo->timeouts.client_write, [this] {  // see SessionTimers
    auto self = shared_from_this();
    if (self->finished() || !self->s_->paused) return;
    State& st = *self->s_;
    // Progress (the client read something, however little) re-arms the check: only a client
    // whose queued bytes did not go down for a whole period is cut off.
    if (st.writer.buffered_bytes() < st.stall_mark) {
      self->arm_write_stall_check();
      return;
    }
    self->on_write_stalled();
  });
}

void ProxySession::on_write_stalled() {
  State& s = *s_;
  s.w.counters().bump(s.w.counters().client_write_stalls);
  if (may_log(s.w)) {
    pdr::log::warn("request {}: client read nothing for timeouts.client_write_ms = {} ms ({} bytes queued); aborted",
                 s.legs.plan.request_id, s.topo->timeouts.client_write.count(), s.writer.buffered_bytes());
  }
  // Closing the legs is how vLLM is told to abort (its KV blocks are freed); the client, who
  // reads nothing, cannot be told anything: its connection is cut.
  close_legs();
  s.writer.abort();
  end(RequestState::kFailed);
}

void ProxySession::on_decode_complete() {
  State& s = *s_;
  if (finished()) return;
  leg_ended(Leg::kDecode);
  s.decode_call.reset();
  const int status = s.decode_status;
  if (status >= 200 && status < 300) {
    s.phases.decode_answered(s.legs.plan.dialect, s.w.counters().pd_phases, SteadyClock::now());
    if (s.decode_events >= 2 && s.routed.decode_load.bound()) {
      const double step = std::chrono::duration<double>(s.last_event_at - s.first_event_at).count() /
                          static_cast<double>(s.decode_events - 1);
      s.routed.decode_load.cell()->ledger.decode_step_seconds.add(step, s.last_event_at);
    }
    s.routed.decode_load.decode_done();
    s.routed.decode_load.prefill_done();
    if (!s.sse) s.route.decode_json(s.decode_body);
    if (s.want_usage) proto::scan_usage(s.sse ? s.sse_tail : s.decode_body, &s.usage);
    // The decode's kv_transfer_params (read by multi_turn above) never reach the client.
    std::string redacted;
    const proto::KvParamsEdit edit = s.sse ? proto::redact_kv_params_events(s.sse_tail, s.partial_flushed, &redacted)
                                           : proto::redact_kv_params_json(s.decode_body, &redacted);
    if (edit == proto::KvParamsEdit::kRefused) {
      refuse_kv_params();
      return;
    }
    if (edit == proto::KvParamsEdit::kRedacted) (s.sse ? s.sse_tail : s.decode_body) = std::move(redacted);
    s.route.decode_done(*s.routed.pair.decode);
    if (s.sse) {
      if (!s.stream_started && !start_client_stream()) return;
      if (!s.sse_tail.empty()) s.writer.write(s.sse_tail);
      s.bytes_out += s.sse_tail.size();
      s.writer.end_stream();
    } else {
      http::Response response;
      response.status = status;
      response.headers.reserve(2);  // in place, as in start_client_stream()
      response.headers.push_back(
          {"Content-Type", s.decode_content_type.empty() ? "application/json" : std::move(s.decode_content_type)});
      response.headers.push_back({"X-Request-Id", s.legs.plan.request_id});
      if (s.req.trace) {
        s.req.trace->answer_bytes(s.decode_body);
        s.req.trace->response_status(status);
      }
      response.body = std::move(s.decode_body);
      s.first_byte_at = SteadyClock::now();
      s.w.counters().time_to_first_byte.record(*s.first_byte_at - s.req.arrived_at);
      send_answer(s.writer, std::move(response), &s.client_status, &s.bytes_out);
    }
    end(RequestState::kDone);
    return;
  }
  const LegFailure cause = classify_status(status);
  if (cause == LegFailure::kStatus4xx) {
    s.w.counters().leg_failed(Leg::kDecode, cause);
    close_legs();
    relay_upstream_error(status, s.decode_content_type, s.decode_body);
    return;
  }
  decode_failed(cause, "decode " + s.routed.pair.decode->key + " answered " + std::to_string(status) + ": " +
                           excerpt(s.decode_body));
}

void ProxySession::refuse_kv_params() {
  State& s = *s_;
  leg_ended(Leg::kDecode);
  s.w.counters().leg_failed(Leg::kDecode, LegFailure::kBadResponse);
  fail(502,
       "decode " + s.routed.pair.decode->key + " answered kv_transfer_params that could not be removed from the answer "
       "(not valid JSON, or in an event of over " + std::to_string(kMaxPartialEvent) + " bytes)",
       "decode_failed");
}

void ProxySession::decode_failed(LegFailure cause, std::string detail) {
  State& s = *s_;
  if (finished()) return;
  if (s.req.trace) s.req.trace->leg_failed(tracing::TraceLeg::kDecode, to_string(cause));
  leg_ended(Leg::kDecode);
  s.w.counters().leg_failed(Leg::kDecode, cause);
  if (may_log(s.w)) pdr::log::warn("request {}: {}", s.legs.plan.request_id, detail);
  if (s.decode_call) {
    s.decode_call->cancel();
    s.decode_call.reset();
  }
  s.last_cause = cause;
  s.last_leg = Leg::kDecode;
  s.last_detail = std::move(detail);
  s.route.exclude(proto::Role::kDecode, s.routed.pair.decode->key);
  const uint32_t budget = std::max<uint32_t>(1, s.topo->retries.decode_attempts);
  const uint32_t left = budget > s.decode_attempts ? budget - s.decode_attempts : 0;
  DecodeRetry retry = s.legs.plan.dialect ? decode_retry(*s.legs.plan.dialect, cause, left) : DecodeRetry::kNone;
  // A decode serving alone has no prefill to pair another decode with: pair anew.
  if (retry == DecodeRetry::kDecodeOnly && !s.routed.pair.prefill) retry = DecodeRetry::kWholePair;
  switch (retry) {
    case DecodeRetry::kNone:
      fail(failure_status(cause), "decode failed: " + s.last_detail, failure_code(Leg::kDecode, cause));
      return;
    case DecodeRetry::kDecodeOnly: {
      InstancePtr next;
      Status st = s.route.reroute_decode(*s.routed.pair.prefill, &next);
      if (!st.is_ok()) {
        fail(failure_status(cause), "decode failed: " + s.last_detail + "; no node left to retry on: " + st.message(),
             failure_code(Leg::kDecode, cause));
        return;
      }
      s.w.counters().retried(Leg::kDecode);
      ++s.retries;
      s.routed.pair.decode = std::move(next);
      // Same body and X-Request-Id; only the DP-rank header depends on the decode chosen.
      s.decode_rank = next_dp_rank(*s.routed.pair.decode);
      s.routed.decode_load = discovery::LoadCharge(*s.routed.pair.decode, s.decode_rank);  // the old node's goes back
      auto& headers = s.legs.decode.headers;
      std::erase_if(headers, [](const auto& h) { return pdr::iequals(h.first, "X-data-parallel-rank"); });
      if (s.decode_rank) headers.emplace_back("X-data-parallel-rank", std::to_string(*s.decode_rank));
      send_decode();
      return;
    }
    case DecodeRetry::kWholePair:
      if (s.prefill_call) {
        if (s.routed.pair.prefill) abort_leg_on_node(s.w, *s.routed.pair.prefill, s.req.path, s.legs.plan.request_id);
        s.prefill_call->cancel();
        s.prefill_call.reset();
      }
      s.prefill_queue.release();
      release_pair();
      pair_and_send(Leg::kDecode);
      return;
  }
}

void ProxySession::on_client_gone() {
  if (finished()) return;
  s_->w.counters().bump(s_->w.counters().client_disconnects);
  close_legs();
  end(RequestState::kCancelled);
}

void ProxySession::relay_upstream_error(int status, const std::string& content_type, const std::string& body) {
  State& s = *s_;
  http::Response response;
  response.status = status;
  response.headers = {{"Content-Type", content_type.empty() ? "application/json" : content_type},
                      {"X-Request-Id", s.legs.plan.request_id}};
  response.body = body;
  if (s.req.trace) s.req.trace->response_status(status);
  send_answer(s.writer, std::move(response), &s.client_status, &s.bytes_out);
  end(RequestState::kDone);
}

void ProxySession::fail(int status, std::string_view message, std::string_view code) {
  State& s = *s_;
  if (finished()) return;
  if (s.stream_started) {
    end_stream_with_error(status, message, code);
    return;
  }
  if (s.req.trace) s.req.trace->response_status(status);
  http::Response response =
      api_error_response(s.req.path, status, message, status == 400 ? "invalid_request_error" : "server_error", code);
  if (!s.legs.plan.request_id.empty()) response.headers.push_back({"X-Request-Id", s.legs.plan.request_id});
  if (code == "slo_unmet" || code == "queue_timeout") response.headers.push_back({"Retry-After", "1"});
  send_answer(s.writer, std::move(response), &s.client_status, &s.bytes_out);
  end(RequestState::kFailed);
}

void ProxySession::end_stream_with_error(int status, std::string_view message, std::string_view code) {
  State& s = *s_;
  // Only whole events were relayed (a partial one held back is dropped), unless a partial event
  // was forced out at kMaxPartialEvent: then a blank line closes it first.
  std::string event = s.partial_flushed ? "\n\n" : "";
  if (s.responses) {
    // The Responses API's named failure events, numbered after the relayed ones; no [DONE]
    // (proto/responses_stream.h).
    const std::string& id = s.responses->response_id();
    event += proto::responses_failure_events(id.empty() ? "resp_" + s.legs.plan.request_id : id,
                                             s.responses->next_sequence_number(), message, code);
  } else if (s.anthropic) {
    // Anthropic's streams end with an `event: error` of its error shape, no [DONE].
    event += proto::anthropic_error_event(status, message);
  } else {
    // vLLM's own shape for an error inside a chat or completions stream: one data event with an
    // OpenAI error object, then [DONE].
    event += "data: ";
    event += http::error_body(message, "server_error", code);
    event += "\n\ndata: [DONE]\n\n";
  }
  // Counted before the client can see the event: a client reading /metrics right after its
  // stream ended must find it (the flaky test_decode_dying_mid_stream_ends_with_an_error_event).
  s.w.counters().bump(s.w.counters().mid_stream_errors);
  s.writer.write(event);
  s.bytes_out += event.size();
  s.writer.end_stream();
  end(RequestState::kFailed);
}

void ProxySession::close_legs() {
  State& s = *s_;
  s.route.cancel();  // a /tokenize call, an SLO wait or a pre-step still running
  // A leg still in flight is aborted by its closed connection, and by id on a tokens-only node.
  if (s.prefill_call) {
    if (s.routed.pair.prefill) abort_leg_on_node(s.w, *s.routed.pair.prefill, s.req.path, s.legs.plan.request_id);
    s.prefill_call->cancel();
    s.prefill_call.reset();
  }
  s.prefill_queue.release();
  if (s.decode_call) {
    if (s.routed.pair.decode) abort_leg_on_node(s.w, *s.routed.pair.decode, s.req.path, s.legs.plan.request_id);
    s.decode_call->cancel();
    s.decode_call.reset();
  }
}

void ProxySession::release_pair() {
  State& s = *s_;
  const bool held = s.routed.prefill_load.bound() || s.routed.decode_load.bound();
  s.routed.prefill_load.release();
  s.routed.decode_load.release();
  if (held) s.w.shared().slo_gate.wake();
  s.routed.pair = Pair{};
  s.routed.prefill_facts = PrefillFacts{};
}

void ProxySession::end(RequestState final_state) {
  State& s = *s_;
  if (s.ended) return;
  s.ended = true;
  s.route.cancel();  // nothing of routing outlives the request (close_legs did it on most paths)
  move_to(final_state);
  hand_over_record(final_state);
  if (s.req.trace) s.req.trace->finish(to_string(final_state));
  const size_t outcome = final_state == RequestState::kDone ? 0 : final_state == RequestState::kFailed ? 1 : 2;
  s.w.counters().request_duration[outcome].record(SteadyClock::now() - s.req.arrived_at);
  s.stall_timer.stop();
  s.head_timer.stop();
  s.request_timer.stop();
  const size_t orphan_limit =
      OrphanLegs::per_worker_limit(s.topo->limits.max_orphan_legs_per_node, s.w.shared().workers);
  if (final_state == RequestState::kDone && s.legs.plan.concurrent && s.prefill_call && orphan_limit > 0 &&
      s.topo->timeouts.orphan_grace.count() > 0) {
    // Concurrent dialects: the decode answered, the prefill may still be finishing (and, on a
    // fast decode, its request may not even have been written yet). Closing it would abort a
    // prefill whose KV already went out; it is read to its end and dropped instead
    // (docs/design/wire-formats.md rule 8). Its answer is no longer buffered and it is closed after
    // timeouts.orphan_grace_ms or at its timeouts.prefill deadline, whichever comes first. It
    // holds no admission slot (a prefill that never answers must not make pdrouter refuse
    // clients): limits.max_orphan_legs_per_node bounds orphans per node, closing the oldest.
    if (s.decode_call) {
      s.decode_call->cancel();
      s.decode_call.reset();
    }
    give_answer_buffer(s.prefill_body);
    // The node's oldest orphan goes first, so the gauge never shows one over the limit.
    std::weak_ptr<ProxySession> evicted;
    s.orphan_id = s.w.orphans().add(s.prefill_key, weak_from_this(), orphan_limit, &evicted);
    if (auto oldest = evicted.lock()) {
      s.w.counters().bump(s.w.counters().orphan_legs.evicted);
      oldest->close_orphan();
    }
    s.orphan = true;
    s.w.counters().orphan_legs.open.fetch_add(1, std::memory_order_relaxed);
    const auto grace = std::min(until(s.prefill_deadline), s.topo->timeouts.orphan_grace);
    s.prefill_timer.start(s.w.timers(), grace, [this] {  // see SessionTimers
      shared_from_this()->on_prefill_deadline();
    });
  } else {
    close_legs();
    s.prefill_timer.stop();
  }
  // An orphan keeps its queued prefill tokens (prefill_queue, given back when it ends: the node
  // is still computing them) but not its request: least_outstanding saw it leave, as before.
  release_pair();
  // Nothing can retry any more: the bodies go now, not when the last callback lets go of the
  // session (an orphaned prefill keeps it for up to timeouts.orphan_grace_ms).
  s.req.body = std::string();
  give_answer_buffer(s.prefill_body);
  s.client = proto::JsonObjectBody();
  s.generate = proto::GenerateView();  // its views were into the client's body
  s.legs.prefill.body = proto::JsonObjectBody();
  s.legs.decode.body = proto::JsonObjectBody();
  s.decode_body = std::string();
  if (s.budget_held != 0) {
    s.w.counters().buffered.release(s.budget_held);
    s.budget_held = 0;
    s.answer_budget = 0;
  }
  give_back_slot(s.w.shared());  // the head waiter gets it (admission.h)
}

void ProxySession::hand_over_record(RequestState final_state) {
  State& s = *s_;
  // A request no leg was sent for cost the nodes nothing: its tokens all go back.
  const bool upstream_work = s.prefill_attempts != 0 || s.decode_attempts != 0;
  s.req.ticket.finish(s.usage, upstream_work);
  if (!s.req.log_record || s.w.shared().access_log == nullptr) return;
  const SteadyClock::time_point now = SteadyClock::now();
  clients::AccessRecord& r = *s.req.log_record;
  r.time = std::chrono::system_clock::now();
  r.request_id = s.legs.plan.request_id;
  // A client that left before any answer: nginx's 499 (client closed request).
  r.status = s.client_status == 0 && final_state == RequestState::kCancelled ? 499 : s.client_status;
  r.outcome = final_state == RequestState::kDone        ? "done"
              : final_state == RequestState::kCancelled ? "cancelled"
              : upstream_work                           ? "failed"
                                                        : "refused";
  r.stream = s.sse;
  r.prefill = s.prefill_key;
  r.decode = s.decode_key;
  if (s.prefill_attempts != 0) r.prefill_rank = s.prefill_rank;
  if (s.decode_attempts != 0) r.decode_rank = s.decode_rank;
  r.retries = s.retries;
  r.prompt_tokens = s.usage.prompt_tokens;
  r.output_tokens = s.usage.output_tokens;
  if (const CacheHits* hits = s.route.cache_hits()) {
    r.cache_source = hits->source == CacheHits::Source::kKvEvents ? "kv_events" : "prefix_tree";
    r.cache_matched = hits->matched(s.prefill_key.empty() ? s.decode_key : s.prefill_key);
    r.cache_prompt = hits->prompt_units;
  }
  const auto ms = [](SteadyClock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  if (s.first_byte_at) r.ttft_ms = ms(*s.first_byte_at - s.req.arrived_at);
  r.total_ms = ms(now - s.req.arrived_at);
  r.bytes_out = s.bytes_out;
  s.w.shared().access_log->log(std::move(r));
  s.req.log_record.reset();
}

}  // namespace pdr::router::proxy
