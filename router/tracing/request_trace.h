// RequestTrace: the spans of one traced P/D request, recorded as the session runs and handed to
// the exporter as each one ends (router/tracing/tracer.h makes it; the session calls it).
//
//   <method> <path>   SERVER    the request, from its head to its end: http.request.method,
//                               url.path, http.route, http.response.status_code, client.address,
//                               gen_ai.operation.name, gen_ai.request.model, gen_ai.usage.*_tokens
//                               (when the answer says), pdrouter.request_id, error.type
//     queue wait      INTERNAL  time waiting for admission (queue_wait(), for an admission queue)
//     route           INTERNAL  one routing decision, from the previous step to the pair chosen:
//                               pdrouter.route.attempt, pdrouter.{prefill,decode}.node,
//                               pdrouter.cache.* (the KV cache match, when cache_aware looked)
//     prefill         CLIENT    one attempt of the leg: server.address, server.port, url.full,
//                               http.request.method, http.response.status_code,
//                               http.request.resend_count (retries), error.type
//     handover        INTERNAL  from the prefill's complete answer to the decode's first byte
//     decode          CLIENT    as prefill
// Each leg attempt's request carries traceparent naming its own span (and the client's
// tracestate), so the node's spans (vLLM's --otlp-traces-endpoint) join the trace under it.
//
// A request whose client sent an unsampled traceparent is not recorded (recording() false): its
// legs get the client's traceparent and tracestate as they came, and nothing else happens.
//
// Worker thread only (the session's). Spans still open when the trace is destroyed (a leg
// pdrouter cancelled) are ended then, marked pdrouter.leg.cancelled.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/address.h"
#include "proto/otlp_span.h"
#include "proto/trace_context.h"

namespace pdr::router {
struct CacheHits;
}

namespace pdr::router::tracing {

class Tracer;

enum class TraceLeg : uint8_t { kPrefill, kDecode };

// Where a request's trace starts (Tracer::begin).
struct TraceStart {
  proto::TraceId trace_id{};
  std::optional<proto::SpanId> parent;  // the client's span, if it sent a valid traceparent
  uint8_t flags = 0x01;
  std::string client_traceparent;  // as the client sent it (passed on when not recording)
  std::string trace_state;
  bool recording = true;
};

class RequestTrace {
 public:
  using Clock = std::chrono::steady_clock;
  using Headers = std::vector<std::pair<std::string, std::string>>;

  // Tracer::begin only.
  RequestTrace(Tracer& tracer, TraceStart start, Clock::time_point arrived_at, std::string_view method,
               std::string_view path, std::string_view peer);
  ~RequestTrace();
  RequestTrace(const RequestTrace&) = delete;
  RequestTrace& operator=(const RequestTrace&) = delete;

  bool recording() const { return recording_; }
  const proto::TraceId& trace_id() const { return server_.trace_id; }

  // The model the client asked for (gen_ai.request.model), once its body is parsed.
  void model(std::string_view model);
  // Hook for an admission queue: the request waited for a slot from `start` to `end` (called
  // once it is admitted, with the wait's own timestamps; the trace is made at admission).
  void queue_wait(Clock::time_point start, Clock::time_point end);
  // A pair was chosen (`prefill` empty: the decode alone). `cache`: cache_aware's match, or null.
  void routed(std::string_view prefill, std::string_view decode, const CacheHits* cache);
  // A leg attempt is about to be sent to `node`: opens its span and writes traceparent (and
  // tracestate) into `headers`, replacing earlier ones (a resent leg gets its new span's id).
  // `secure`: the leg speaks TLS (url.full's scheme).
  void leg_started(TraceLeg leg, const proto::HostPort& node, std::string_view path, bool secure, Headers* headers);
  void leg_answered(TraceLeg leg, int status);             // its answer's head arrived
  void leg_failed(TraceLeg leg, std::string_view error_type);  // it failed (before or after it ended)
  void leg_ended(TraceLeg leg);                            // its answer is complete, or it failed
  // Answer bytes of the decode (a JSON answer, or events of a stream): token usage, when given.
  void answer_bytes(std::string_view bytes);
  // What the client was answered (HTTP status), when the session sends it.
  void response_status(int status);
  // The request ended ("done", "failed", "cancelled"): the server span is exported.
  void finish(std::string_view outcome);

 private:
  struct LegSpan {
    proto::Span span;
    bool open = false;     // started, not ended
    bool pending = false;  // ended, not yet exported (a failure may still be noted)
    uint32_t attempts = 0;
    int status = 0;
  };
  uint64_t unix_ns(Clock::time_point t) const;
  proto::Span child(std::string name, proto::Span::Kind kind, Clock::time_point start) const;
  void submit(proto::Span&& span);
  void flush_leg(LegSpan& leg);

  Tracer& tracer_;
  const bool recording_;
  uint8_t flags_;
  // The client's traceparent/tracestate as they came (non-recording: passed on as they are).
  std::string client_traceparent_;
  std::string trace_state_;
  proto::Span server_;
  Clock::time_point anchor_steady_;
  uint64_t anchor_unix_ns_ = 0;
  Clock::time_point last_mark_;  // where the next route span starts
  std::optional<Clock::time_point> prefill_done_at_;
  std::array<LegSpan, 2> legs_;
  uint32_t routes_ = 0;
  int status_ = 0;
  int64_t input_tokens_ = -1, output_tokens_ = -1;
  bool finished_ = false;
};

}  // namespace pdr::router::tracing
