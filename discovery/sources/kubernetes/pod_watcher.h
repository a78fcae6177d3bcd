// PodWatcher: Kubernetes pod discovery (topology `kubernetes:`). Pods that match the label
// selector in one namespace become registry entries (InstanceSource::kKubernetes) while they
// serve (pod_node.h says when, and what node a pod is).
//
// With kubernetes.prefill_selector / decode_selector, there is still ONE list and ONE watch (with
// label_selector, if set, sent to the server) and the two selectors are matched here, locally:
// Kubernetes selectors cannot say "A or B", and two watches would be two resourceVersions whose
// events interleave arbitrarily; a pod relabelled from prefill to decode would then be DELETED on
// one stream and ADDED on the other in either order. One stream gives each pod's changes in order.
//
// The API, as documented for core/v1 pods (proto/k8s_pods.h):
//   list   GET /api/v1/namespaces/NS/pods?labelSelector=SEL
//   watch  GET ...&watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T
// The list replaces everything known (pods gone meanwhile are removed); the watch applies ADDED,
// MODIFIED and DELETED, and BOOKMARK only moves the resourceVersion. When the server ends the
// watch (timeoutSeconds, a restart) it is opened again from the last resourceVersion; when the
// server says 410 Gone (an ERROR event or the HTTP status: that version is too old) the watcher
// lists again. A line that does not decode is counted and skipped. A failed list or watch
// (unreachable, 401/403, ...) is retried after kubernetes.retry; the registry keeps its last view.
//
// A pod leaves the registry on DELETED, when it stops being Running and Ready, or loses its IP;
// a pod with deletionTimestamp stays, draining (no new requests), until it goes.
//
// The bearer token is read from kubernetes.token_file at start and again, when older than
// token_refresh, before each request. It is never logged.
//
// Transport: router/http/upstream_client, plain HTTP (`kubectl proxy`, the tests' fake API server) or TLS
// for an https:// API server (options.tls; in a pod, kubernetes.ca_file names the service
// account's ca.crt).
//
// Threads: start() and stop() from the owner's thread; everything else runs on the watcher's
// own thread and libuv loop (discovery/sources/loop_thread.h). status(), last_error(), state()
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "proto/base/status.h"
#include "discovery/config/topology.h"
#include "router/http/tls_client.h"
#include "discovery/discovery_service.h"

namespace pdr::discovery::sources::kubernetes {

struct PodWatcherOptions {
  config::Topology::Kubernetes kubernetes;
  config::Topology::Connectors connectors;  // defaults for what a pod's annotations leave out
  std::chrono::milliseconds request_timeout{10000};  // connect, and first byte of an answer
  // Set for an https:// API server (kubernetes.ca_file, else the system's CAs): every connection
  // is TLS and the server's certificate is verified against the API server's host.
  std::shared_ptr<const http::TlsClientContext> tls;
};

// Counters (any thread; relaxed).
struct PodWatcherStatus {
  std::atomic<bool> watching{false};    // a watch stream is open and answering
  std::atomic<uint64_t> lists{0};       // successful lists (the first one included)
  std::atomic<uint64_t> relists{0};     // lists after 410 Gone
  std::atomic<uint64_t> watches{0};     // watch streams opened
  std::atomic<uint64_t> events{0};      // ADDED / MODIFIED / DELETED events applied
  std::atomic<uint64_t> bookmarks{0};
  std::atomic<uint64_t> errors{0};      // failed lists and watches (unreachable, HTTP errors)
  std::atomic<uint64_t> bad_events{0};  // watch lines or list answers that did not decode
  std::atomic<uint64_t> bad_pods{0};    // pods whose labels or annotations describe no node
  std::atomic<uint64_t> ambiguous_pods{0};  // of those: pods matching prefill_ and decode_selector
  std::atomic<uint64_t> pods{0};        // pods that are registry entries now (gauge)
};

class PodWatcher {
 public:
  explicit PodWatcher(discovery::DiscoveryService& discovery);
  ~PodWatcher();  // stop()
  PodWatcher(const PodWatcher&) = delete;
  PodWatcher& operator=(const PodWatcher&) = delete;

  Status start(PodWatcherOptions options);
  // Joins the thread; the registry keeps the entries. Idempotent.
  void stop();

  const PodWatcherStatus& status() const { return status_; }
  const PodWatcherOptions& options() const { return options_; }
  // "starting", "listing", "watching", "retrying" or "stopped".
  std::string state() const;
  std::string last_error() const;
  std::string resource_version() const;

 private:
  class Impl;
  discovery::DiscoveryService& discovery_;
  PodWatcherOptions options_;
  PodWatcherStatus status_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::discovery::sources::kubernetes
