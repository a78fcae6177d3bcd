// SpanExporter: finished spans out to an OpenTelemetry collector over OTLP/HTTP, JSON encoding
// (proto/otlp_span.h), from a background thread of its own.
//
// submit() is all a request pays: one short mutex hold to append to a bounded queue
// (tracing.max_queue_spans); a full queue drops the span (counted), so a slow or dead collector
// never makes a request wait or pdrouter grow. The thread sends a batch when max_batch_spans
// wait or batch_ms passed since the last one; each export has export_timeout_ms to connect, send
// and get its answer. A batch that fails (no connection, timeout, an answer other than 2xx) is
// dropped (counted, never retried: a collector that is down must not make pdrouter hold spans)
// and the next export waits a back-off, doubling from 1 s up to kMaxBackoff, reset by a success.
//
// Threads: start() and stop() from one controlling thread; submit() and the counters from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proto/base/log_limiter.h"
#include "proto/base/metrics_writer.h"
#include "proto/base/status.h"
#include "proto/address.h"
#include "proto/otlp_span.h"

namespace pdr::router::tracing {

struct ExporterOptions {
  proto::HostPort collector;
  std::string path = "/v1/traces";
  std::string service_name = "pdrouter";
  uint32_t max_queue_spans = 8192;
  std::chrono::milliseconds batch{1000};
  uint32_t max_batch_spans = 512;
  std::chrono::milliseconds export_timeout{2000};
  std::chrono::milliseconds first_backoff{1000};
  std::chrono::milliseconds max_backoff{30000};
};

struct ExporterCounters {
  std::atomic<uint64_t> spans_exported{0};
  std::atomic<uint64_t> spans_dropped_queue_full{0};
  std::atomic<uint64_t> spans_dropped_export_failed{0};
  std::atomic<uint64_t> exports_ok{0};
  std::atomic<uint64_t> exports_failed{0};
  std::atomic<uint64_t> queued{0};  // gauge
};

class SpanExporter {
 public:
  SpanExporter() = default;
  ~SpanExporter();  // stop()
  SpanExporter(const SpanExporter&) = delete;
  SpanExporter& operator=(const SpanExporter&) = delete;

  // Starts the thread. Call once.
  Status start(ExporterOptions options);
  // Ends the thread: an export in flight is given up at once (its spans counted as dropped), what
  // is queued gets one last export within kFinalExportTimeout (not while backing off), so a
  // collector that does not answer delays a stopping process by that much at most. Idempotent.
  void stop();
  static constexpr std::chrono::milliseconds kFinalExportTimeout{500};

  // Any thread, never blocks on I/O. False when the span was dropped (queue full, or stopped).
  bool submit(proto::Span&& span);

  const ExporterCounters& counters() const { return counters_; }

 private:
  void run();
  // Sends `batch` (emptied); updates the counters and the back-off. `final`: during stop().
  void export_batch(std::vector<proto::Span>& batch, bool final);

  ExporterOptions options_;
  proto::SpanSource source_;
  ExporterCounters counters_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<proto::Span> queue_;  // guarded by mutex_
  bool stopping_ = false;           // guarded by mutex_
  bool running_ = false;            // start()/stop() thread only
  int cancel_pipe_[2] = {-1, -1};   // stop() writes to [1]: an export in flight gives up
  std::thread thread_;
  // Exporter thread only.
  std::chrono::milliseconds backoff_{0};
  std::chrono::steady_clock::time_point backoff_until_{};
  std::string body_;  // encoding buffer, reused
  LogLimiter log_limit_{"tracing export"};
};

// pdrouter_trace_* (all zero with tracing off: `exporter` null).
void write_tracing_metrics(MetricsWriter& out, const SpanExporter* exporter, uint64_t invalid_traceparents);

}  // namespace pdr::router::tracing
