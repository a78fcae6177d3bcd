#include "router/tracing/request_trace.h"

#include <charconv>

#include "proto/base/ascii.h"
#include "router/policies/policy.h"
#include "router/tracing/tracer.h"

namespace pdr::router::tracing {

namespace {

using proto::SpanAttribute;

const char* leg_name(TraceLeg leg) { return leg == TraceLeg::kPrefill ? "prefill" : "decode"; }

// OpenTelemetry's gen_ai.operation.name for each P/D path.
const char* operation_of(std::string_view path) {
  if (path == "/v1/chat/completions" || path == "/v1/messages" || path == "/v1/responses") return "chat";
  return "text_completion";
}

// "127.0.0.1:5000" / "[::1]:5000" -> the address alone.
std::string_view address_of(std::string_view peer) {
  if (peer.starts_with('[')) {
    const size_t close = peer.find(']');
    return close == std::string_view::npos ? peer : peer.substr(1, close - 1);
  }
  const size_t colon = peer.rfind(':');
  return colon == std::string_view::npos ? peer : peer.substr(0, colon);
}

// The number after `"key":` in `text` (the last occurrence: usage comes last), or -1.
int64_t last_number(std::string_view text, std::string_view key) {
  const size_t at = text.rfind(key);
  if (at == std::string_view::npos) return -1;
  size_t i = at + key.size();
  while (i < text.size() && (text[i] == ' ' || text[i] == ':')) ++i;
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data() + i, text.data() + text.size(), v);
  return ec == std::errc() && end != text.data() + i ? v : -1;
}

void set_attribute(std::vector<SpanAttribute>& attributes, SpanAttribute a) {
  for (SpanAttribute& existing : attributes) {
    if (existing.key == a.key) {
      existing = std::move(a);
      return;
    }
  }
  attributes.push_back(std::move(a));
}

}  // namespace

RequestTrace::RequestTrace(Tracer& tracer, TraceStart start, Clock::time_point arrived_at, std::string_view method,
                           std::string_view path, std::string_view peer)
    : tracer_(tracer),
      recording_(start.recording),
      flags_(start.flags),
      client_traceparent_(std::move(start.client_traceparent)),
      trace_state_(std::move(start.trace_state)),
      last_mark_(arrived_at) {
  if (!recording_) return;
  // Spans are timed with the steady clock the session uses; Unix times are anchored once.
  anchor_steady_ = Clock::now();
  anchor_unix_ns_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  server_.trace_id = start.trace_id;
  server_.span_id = Tracer::new_span_id();
  if (start.parent) server_.parent_span_id = *start.parent;
  server_.trace_state = trace_state_;
  server_.name = std::string(method) + " " + std::string(path);
  server_.kind = proto::Span::Kind::kServer;
  server_.start_unix_ns = unix_ns(arrived_at);
  auto& a = server_.attributes;
  a.reserve(12);
  a.push_back(SpanAttribute::str("http.request.method", std::string(method)));
  a.push_back(SpanAttribute::str("url.path", std::string(path)));
  a.push_back(SpanAttribute::str("http.route", std::string(path)));
  a.push_back(SpanAttribute::str("network.protocol.version", "1.1"));
  a.push_back(SpanAttribute::str("client.address", std::string(address_of(peer))));
  a.push_back(SpanAttribute::str("gen_ai.operation.name", operation_of(path)));
}

RequestTrace::~RequestTrace() {
  if (!recording_) return;
  const Clock::time_point now = Clock::now();
  for (LegSpan& leg : legs_) {
    if (leg.open) {
      leg.span.end_unix_ns = unix_ns(now);
      leg.span.attributes.push_back(SpanAttribute::boolean("pdrouter.leg.cancelled", true));
      leg.open = false;
      leg.pending = true;
    }
    flush_leg(leg);
  }
  if (!finished_) finish("cancelled");
}

uint64_t RequestTrace::unix_ns(Clock::time_point t) const {
  const auto delta = std::chrono::duration_cast<std::chrono::nanoseconds>(t - anchor_steady_).count();
  return static_cast<uint64_t>(static_cast<int64_t>(anchor_unix_ns_) + delta);
}

proto::Span RequestTrace::child(std::string name, proto::Span::Kind kind, Clock::time_point start) const {
  proto::Span s;
  s.trace_id = server_.trace_id;
  s.span_id = Tracer::new_span_id();
  s.parent_span_id = server_.span_id;
  s.trace_state = trace_state_;
  s.name = std::move(name);
  s.kind = kind;
  s.start_unix_ns = unix_ns(start);
  return s;
}

void RequestTrace::submit(proto::Span&& span) { tracer_.submit(std::move(span)); }

void RequestTrace::flush_leg(LegSpan& leg) {
  if (!leg.pending) return;
  leg.pending = false;
  submit(std::move(leg.span));
  leg.span = proto::Span();
}

void RequestTrace::model(std::string_view model) {
  if (!recording_ || model.empty()) return;
  set_attribute(server_.attributes, SpanAttribute::str("gen_ai.request.model", std::string(model)));
}

void RequestTrace::queue_wait(Clock::time_point start, Clock::time_point end) {
  if (!recording_ || finished_) return;
  proto::Span s = child("queue wait", proto::Span::Kind::kInternal, start);
  s.end_unix_ns = unix_ns(end);
  submit(std::move(s));
  if (end > last_mark_) last_mark_ = end;
}

void RequestTrace::routed(std::string_view prefill, std::string_view decode, const CacheHits* cache) {
  if (!recording_ || finished_) return;
  const Clock::time_point now = Clock::now();
  proto::Span s = child("route", proto::Span::Kind::kInternal, last_mark_);
  s.end_unix_ns = unix_ns(now);
  s.attributes.push_back(SpanAttribute::integer("pdrouter.route.attempt", ++routes_));
  if (!prefill.empty()) s.attributes.push_back(SpanAttribute::str("pdrouter.prefill.node", std::string(prefill)));
  s.attributes.push_back(SpanAttribute::str("pdrouter.decode.node", std::string(decode)));
  if (cache != nullptr) {
    s.attributes.push_back(SpanAttribute::str(
        "pdrouter.cache.source", cache->source == CacheHits::Source::kKvEvents ? "kv_events" : "prefix_tree"));
    s.attributes.push_back(SpanAttribute::integer("pdrouter.cache.prompt_units", cache->prompt_units));
    if (!prefill.empty()) {
      s.attributes.push_back(SpanAttribute::integer("pdrouter.cache.prefill_matched", cache->matched(prefill)));
    }
    s.attributes.push_back(SpanAttribute::integer("pdrouter.cache.decode_matched", cache->matched(decode)));
  }
  submit(std::move(s));
  last_mark_ = now;
}

void RequestTrace::leg_started(TraceLeg leg, const proto::HostPort& node, std::string_view path, bool secure,
                               Headers* headers) {
  std::erase_if(*headers, [](const auto& h) { return iequals(h.first, "traceparent") || iequals(h.first, "tracestate"); });
  if (!recording_) {
    headers->emplace_back("traceparent", client_traceparent_);
    if (!trace_state_.empty()) headers->emplace_back("tracestate", trace_state_);
    return;
  }
  LegSpan& l = legs_[static_cast<size_t>(leg)];
  flush_leg(l);
  if (l.open) {  // the last attempt was cancelled without an end (a retry replaced it)
    l.span.end_unix_ns = unix_ns(Clock::now());
    l.span.attributes.push_back(SpanAttribute::boolean("pdrouter.leg.cancelled", true));
    l.pending = true;
    flush_leg(l);
  }
  l.span = child(leg_name(leg), proto::Span::Kind::kClient, Clock::now());
  l.open = true;
  l.status = 0;
  auto& a = l.span.attributes;
  a.reserve(10);
  a.push_back(SpanAttribute::str("pdrouter.leg", leg_name(leg)));
  a.push_back(SpanAttribute::str("http.request.method", "POST"));
  a.push_back(SpanAttribute::str("server.address", node.host));
  a.push_back(SpanAttribute::integer("server.port", node.port));
  a.push_back(SpanAttribute::str("url.full", (secure ? "https://" : "http://") + node.to_string() + std::string(path)));
  if (l.attempts > 0) a.push_back(SpanAttribute::integer("http.request.resend_count", l.attempts));
  ++l.attempts;
  for (const auto& [name, value] : *headers) {
    if (iequals(name, "X-Request-Id")) {
      set_attribute(server_.attributes, SpanAttribute::str("pdrouter.request_id", value));
      break;
    }
  }
  headers->emplace_back("traceparent", proto::format_traceparent(l.span.trace_id, l.span.span_id, flags_));
  if (!trace_state_.empty()) headers->emplace_back("tracestate", trace_state_);
}

void RequestTrace::leg_answered(TraceLeg leg, int status) {
  if (!recording_) return;
  LegSpan& l = legs_[static_cast<size_t>(leg)];
  if (!l.open) return;
  l.status = status;
  l.span.attributes.push_back(SpanAttribute::integer("http.response.status_code", status));
  if (status >= 400) {
    l.span.status = proto::Span::StatusCode::kError;
    l.span.attributes.push_back(SpanAttribute::str("error.type", std::to_string(status)));
  }
  if (leg == TraceLeg::kDecode && prefill_done_at_ && !finished_) {
    proto::Span h = child("handover", proto::Span::Kind::kInternal, *prefill_done_at_);
    h.end_unix_ns = unix_ns(Clock::now());
    submit(std::move(h));
    prefill_done_at_.reset();
  }
}

void RequestTrace::leg_failed(TraceLeg leg, std::string_view error_type) {
  if (!recording_) return;
  LegSpan& l = legs_[static_cast<size_t>(leg)];
  if (!l.open && !l.pending) return;
  l.span.status = proto::Span::StatusCode::kError;
  l.span.status_message = std::string(error_type);
  set_attribute(l.span.attributes, SpanAttribute::str("error.type", std::string(error_type)));
  if (leg == TraceLeg::kPrefill) prefill_done_at_.reset();
}

void RequestTrace::leg_ended(TraceLeg leg) {
  if (!recording_) return;
  LegSpan& l = legs_[static_cast<size_t>(leg)];
  if (!l.open) return;
  const Clock::time_point now = Clock::now();
  l.open = false;
  l.pending = true;
  l.span.end_unix_ns = unix_ns(now);
  if (leg == TraceLeg::kPrefill && l.status >= 200 && l.status < 300) prefill_done_at_ = now;
  last_mark_ = now;
  if (finished_) flush_leg(l);  // an orphaned prefill: nothing will note a failure any more
}

void RequestTrace::answer_bytes(std::string_view bytes) {
  if (!recording_ || bytes.find("_tokens") == std::string_view::npos) return;
  // OpenAI's usage (prompt/completion_tokens), Anthropic's and the Responses API's (input/output).
  for (const auto& [key, out] : {std::pair{std::string_view("\"prompt_tokens\""), &input_tokens_},
                                 std::pair{std::string_view("\"input_tokens\""), &input_tokens_},
                                 std::pair{std::string_view("\"completion_tokens\""), &output_tokens_},
                                 std::pair{std::string_view("\"output_tokens\""), &output_tokens_}}) {
    if (const int64_t v = last_number(bytes, key); v >= 0) *out = v;
  }
}

void RequestTrace::response_status(int status) { status_ = status; }

void RequestTrace::finish(std::string_view outcome) {
  if (!recording_ || finished_) return;
  finished_ = true;
  for (LegSpan& leg : legs_) flush_leg(leg);
  server_.end_unix_ns = unix_ns(Clock::now());
  auto& a = server_.attributes;
  if (status_ != 0) a.push_back(SpanAttribute::integer("http.response.status_code", status_));
  if (input_tokens_ >= 0) a.push_back(SpanAttribute::integer("gen_ai.usage.input_tokens", input_tokens_));
  if (output_tokens_ >= 0) a.push_back(SpanAttribute::integer("gen_ai.usage.output_tokens", output_tokens_));
  a.push_back(SpanAttribute::str("pdrouter.outcome", std::string(outcome)));
  // HTTP semantic conventions: a server span is an error for 5xx answers only.
  if (status_ >= 500) {
    server_.status = proto::Span::StatusCode::kError;
    a.push_back(SpanAttribute::str("error.type", std::to_string(status_)));
  } else if (outcome == "cancelled" && status_ == 0) {
    a.push_back(SpanAttribute::str("error.type", "client_closed"));
  }
  submit(std::move(server_));
}

}  // namespace pdr::router::tracing
