// Tracer: whether a P/D request is traced, and the way its spans leave (router/tracing/).
// One per process, made at start when tracing.endpoint is set (router/server.cc), shared by every
// worker. Sampling is parent-based: a client's valid traceparent decides (sampled flag set:
// recorded; clear: not recorded, but passed on to the nodes); without one, a new trace is started
// for sampling_ratio of the requests, chosen from the trace id (OpenTelemetry's TraceIdRatioBased,
// so every replica decides alike). With tracing off there is no Tracer and requests pay nothing.
//
// Threads: begin() and submit() from any worker; the counters from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "router/http/http_message.h"
#include "proto/otlp_span.h"
#include "router/tracing/request_trace.h"
#include "router/tracing/span_exporter.h"

namespace pdr::router::tracing {

class Tracer {
 public:
  explicit Tracer(SpanExporter& exporter) : exporter_(exporter) {}

  // The trace of `request` (its traceparent and tracestate headers), or null when it is not
  // traced. `arrived_at`: when its head was read (the server span's start).
  std::unique_ptr<RequestTrace> begin(const http::Request& request, double sampling_ratio,
                                      std::chrono::steady_clock::time_point arrived_at);

  void submit(proto::Span&& span) { exporter_.submit(std::move(span)); }
  uint64_t invalid_traceparents() const { return invalid_traceparents_.load(std::memory_order_relaxed); }
  const SpanExporter& exporter() const { return exporter_; }

  // Fresh random ids (never all zero), from a per-thread generator.
  static proto::TraceId new_trace_id();
  static proto::SpanId new_span_id();
  // TraceIdRatioBased: the trace id's last 8 bytes, read as a number, under ratio * 2^64.
  static bool ratio_samples(const proto::TraceId& id, double ratio);

 private:
  SpanExporter& exporter_;
  std::atomic<uint64_t> invalid_traceparents_{0};
};

}  // namespace pdr::router::tracing
