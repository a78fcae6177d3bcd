#include "router/tracing/span_exporter.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>

#include "proto/base/log.h"
#include "router/tracing/otlp_http_post.h"

namespace pdr::router::tracing {

namespace {
using Clock = std::chrono::steady_clock;
}

SpanExporter::~SpanExporter() { stop(); }

Status SpanExporter::start(ExporterOptions options) {
  if (running_) return Status(StatusCode::kRejected, "span exporter already started");
  options_ = std::move(options);
  source_.service_name = options_.service_name;
  source_.service_version = PDR_VERSION;
  source_.scope_name = "pdrouter";
  source_.scope_version = PDR_VERSION;
  queue_.reserve(std::min<uint32_t>(options_.max_queue_spans, 4096));
  if (::pipe2(cancel_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Status(StatusCode::kIoError, std::string("tracing: pipe: ") + std::strerror(errno));
  }
  running_ = true;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "pdr-otlp");
    run();
  });
  pdr::log::info("tracing: spans go to http://{}{} (OTLP/HTTP JSON)", options_.collector.to_string(), options_.path);
  return Status::ok();
}

void SpanExporter::stop() {
  if (!running_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  // An export in flight now gives up (a collector that does not answer must not hold the stop for
  // export_timeout); the final ones do not watch the pipe.
  const char byte = 1;
  (void)!::write(cancel_pipe_[1], &byte, 1);
  thread_.join();
  ::close(cancel_pipe_[0]);
  ::close(cancel_pipe_[1]);
  cancel_pipe_[0] = cancel_pipe_[1] = -1;
  running_ = false;
}

bool SpanExporter::submit(proto::Span&& span) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || queue_.size() >= options_.max_queue_spans) {
      counters_.spans_dropped_queue_full.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(std::move(span));
    counters_.queued.fetch_add(1, std::memory_order_relaxed);  // before the exporter can take it
    wake = queue_.size() == options_.max_batch_spans;
  }
  if (wake) wake_.notify_one();
  return true;
}

void SpanExporter::run() {
  std::vector<proto::Span> batch;
  batch.reserve(options_.max_batch_spans);
  Clock::time_point next = Clock::now() + options_.batch;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // A batch leaves when it is full or batch_ms is over, never during a back-off.
    const Clock::time_point due = std::max(next, backoff_until_);
    wake_.wait_until(lock, due, [&] {
      return stopping_ || (queue_.size() >= options_.max_batch_spans && Clock::now() >= backoff_until_);
    });
    const bool stopping = stopping_;
    if (!stopping && Clock::now() < backoff_until_) continue;
    const size_t n = std::min<size_t>(queue_.size(), options_.max_batch_spans);
    batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + n));
    queue_.erase(queue_.begin(), queue_.begin() + n);
    const bool more = !queue_.empty();
    lock.unlock();
    counters_.queued.fetch_sub(n, std::memory_order_relaxed);
    if (!batch.empty()) {
      if (stopping && Clock::now() < backoff_until_) {
        counters_.spans_dropped_export_failed.fetch_add(batch.size(), std::memory_order_relaxed);
        batch.clear();
      } else {
        export_batch(batch, stopping);
      }
    }
    next = Clock::now() + (more ? std::chrono::milliseconds(0) : options_.batch);
    lock.lock();
    if (stopping && (queue_.empty() || Clock::now() < backoff_until_)) break;
  }
  // What is left when the thread ends is dropped, counted.
  counters_.spans_dropped_export_failed.fetch_add(queue_.size(), std::memory_order_relaxed);
  counters_.queued.fetch_sub(queue_.size(), std::memory_order_relaxed);
  queue_.clear();
}

void SpanExporter::export_batch(std::vector<proto::Span>& batch, bool final) {
  body_.clear();
  proto::encode_otlp_json(source_, batch, &body_);
  int status = 0;
  Status st = otlp_http_post(options_.collector, options_.path, "application/json", body_,
                             final ? std::min(options_.export_timeout, kFinalExportTimeout) : options_.export_timeout,
                             &status, final ? -1 : cancel_pipe_[0]);
  if (st && status >= 200 && status < 300) {
    counters_.exports_ok.fetch_add(1, std::memory_order_relaxed);
    counters_.spans_exported.fetch_add(batch.size(), std::memory_order_relaxed);
    backoff_ = std::chrono::milliseconds(0);
    backoff_until_ = {};
  } else {
    counters_.exports_failed.fetch_add(1, std::memory_order_relaxed);
    counters_.spans_dropped_export_failed.fetch_add(batch.size(), std::memory_order_relaxed);
    backoff_ = backoff_.count() == 0 ? options_.first_backoff : std::min(backoff_ * 2, options_.max_backoff);
    backoff_until_ = Clock::now() + backoff_;
    if (log_limit_.allow(Clock::now())) {
      pdr::log::warn("tracing: {} spans dropped: {}; next export in {} ms", batch.size(),
                     st ? "collector answered " + std::to_string(status) : st.message(), backoff_.count());
    }
  }
  batch.clear();
  if (body_.capacity() > (4u << 20)) std::string().swap(body_);
}

void write_tracing_metrics(MetricsWriter& out, const SpanExporter* exporter, uint64_t invalid_traceparents) {
  auto v = [exporter](std::atomic<uint64_t> ExporterCounters::*field) {
    return exporter != nullptr ? static_cast<double>((exporter->counters().*field).load(std::memory_order_relaxed))
                               : 0.0;
  };
  const char* spans_help =
      "Spans by outcome: exported (the collector took them), dropped_queue_full (tracing.max_queue_spans waited "
      "already), dropped_export_failed (the collector was down, slow or refused)";
  out.counter("pdrouter_trace_spans_total", spans_help, v(&ExporterCounters::spans_exported), {{"result", "exported"}});
  out.counter("pdrouter_trace_spans_total", spans_help, v(&ExporterCounters::spans_dropped_queue_full),
              {{"result", "dropped_queue_full"}});
  out.counter("pdrouter_trace_spans_total", spans_help, v(&ExporterCounters::spans_dropped_export_failed),
              {{"result", "dropped_export_failed"}});
  const char* exports_help = "OTLP/HTTP exports (one batch each) by result";
  out.counter("pdrouter_trace_exports_total", exports_help, v(&ExporterCounters::exports_ok), {{"result", "ok"}});
  out.counter("pdrouter_trace_exports_total", exports_help, v(&ExporterCounters::exports_failed),
              {{"result", "failed"}});
  out.gauge("pdrouter_trace_queue_spans", "Spans waiting for export", v(&ExporterCounters::queued));
  out.counter("pdrouter_trace_invalid_traceparent_total",
              "Client traceparent headers that were not valid W3C Trace Context (ignored: a new trace starts)",
              static_cast<double>(invalid_traceparents));
}

}  // namespace pdr::router::tracing
