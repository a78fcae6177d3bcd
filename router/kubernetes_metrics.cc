#include "router/kubernetes_metrics.h"

namespace pdr::router {

void write_kubernetes_metrics(MetricsWriter& out, const discovery::sources::kubernetes::PodWatcher* watcher) {
  const discovery::sources::kubernetes::PodWatcherStatus empty;
  const discovery::sources::kubernetes::PodWatcherStatus& s = watcher != nullptr ? watcher->status() : empty;
  auto d = [](const std::atomic<uint64_t>& v) { return static_cast<double>(v.load(std::memory_order_relaxed)); };
  out.gauge("pdrouter_kubernetes_watching", "1 while the pod watch stream is open, else 0",
            s.watching.load(std::memory_order_relaxed) ? 1.0 : 0.0);
  out.gauge("pdrouter_kubernetes_pods", "Pods that are registry entries now", d(s.pods));
  out.counter("pdrouter_kubernetes_lists_total", "Pod lists answered by the API server", d(s.lists));
  out.counter("pdrouter_kubernetes_relists_total", "Lists again after 410 Gone (resourceVersion too old)",
              d(s.relists));
  out.counter("pdrouter_kubernetes_watches_total", "Pod watch streams opened", d(s.watches));
  out.counter("pdrouter_kubernetes_events_total", "Pod watch events applied (ADDED, MODIFIED, DELETED)", d(s.events));
  out.counter("pdrouter_kubernetes_bookmarks_total", "Pod watch bookmarks received", d(s.bookmarks));
  out.counter("pdrouter_kubernetes_errors_total", "Pod lists and watches that failed (unreachable, HTTP errors)",
              d(s.errors));
  out.counter("pdrouter_kubernetes_bad_events_total", "Watch lines or list answers that did not decode",
              d(s.bad_events));
  out.counter("pdrouter_kubernetes_bad_pods_total", "Pods whose labels or annotations describe no node",
              d(s.bad_pods));
  out.counter("pdrouter_kubernetes_ambiguous_pods_total",
              "Pods refused because their labels match both prefill_selector and decode_selector",
              d(s.ambiguous_pods));
}

}  // namespace pdr::router
