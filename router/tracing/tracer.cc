#include "router/tracing/tracer.h"

#include <cmath>
#include <random>

namespace pdr::router::tracing {

namespace {

// splitmix64 per thread, seeded once from std::random_device: ids are unique, not secret.
uint64_t next_random() {
  thread_local uint64_t state = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <size_t N>
void fill_random(std::array<uint8_t, N>* out) {
  do {
    for (size_t i = 0; i < N; i += 8) {
      uint64_t r = next_random();
      for (size_t j = i; j < i + 8 && j < N; ++j, r >>= 8) (*out)[j] = static_cast<uint8_t>(r);
    }
  } while (proto::is_zero(*out));
}

}  // namespace

proto::TraceId Tracer::new_trace_id() {
  proto::TraceId id;
  fill_random(&id);
  return id;
}

proto::SpanId Tracer::new_span_id() {
  proto::SpanId id;
  fill_random(&id);
  return id;
}

bool Tracer::ratio_samples(const proto::TraceId& id, double ratio) {
  if (ratio >= 1.0) return true;
  if (!(ratio > 0.0)) return false;
  uint64_t v = 0;
  for (size_t i = 8; i < 16; ++i) v = v << 8 | id[i];
  // ratio * 2^64 as an integer bound (ratio < 1, so it fits).
  const auto bound = static_cast<uint64_t>(std::ldexp(ratio, 64));
  return v < bound;
}

std::unique_ptr<RequestTrace> Tracer::begin(const http::Request& request, double sampling_ratio,
                                            std::chrono::steady_clock::time_point arrived_at) {
  TraceStart start;
  if (auto header = request.header("traceparent")) {
    proto::TraceParent p;
    if (proto::parse_traceparent(*header, &p)) {
      start.trace_id = p.trace_id;
      start.parent = p.parent_id;
      start.flags = p.flags;
      start.recording = p.sampled();
      start.client_traceparent = proto::format_traceparent(p.trace_id, p.parent_id, p.flags);
      // tracestate is read only with a valid traceparent (W3C Trace Context 3.3.1).
      if (auto state = request.header("tracestate")) start.trace_state = std::string(proto::usable_tracestate(*state));
      return std::make_unique<RequestTrace>(*this, std::move(start), arrived_at, request.method, request.path,
                                            request.peer);
    }
    invalid_traceparents_.fetch_add(1, std::memory_order_relaxed);
  }
  // A new trace: decided on the id it would get, so that the id drawn is the one used.
  start.trace_id = new_trace_id();
  if (!ratio_samples(start.trace_id, sampling_ratio)) return nullptr;  // nothing to record or pass on
  return std::make_unique<RequestTrace>(*this, std::move(start), arrived_at, request.method, request.path,
                                        request.peer);
}

}  // namespace pdr::router::tracing
