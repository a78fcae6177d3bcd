// Kubernetes API pod messages (core/v1), as pod discovery reads them (discovery/sources/kubernetes/pod_watcher.h):
// - the answer of GET /api/v1/namespaces/NS/pods?labelSelector=...: a PodList
//   {"kind":"PodList","metadata":{"resourceVersion":"RV"},"items":[Pod...]};
// - one line of GET ...&watch=1&resourceVersion=RV&allowWatchBookmarks=true (a chunked stream of
//   JSON objects, one per line): {"type":"ADDED|MODIFIED|DELETED|BOOKMARK|ERROR","object":{...}}.
//   A BOOKMARK's object is a Pod with only metadata.resourceVersion; an ERROR's object is a
//   Status {"kind":"Status","code":410,"reason":"Expired","message":"too old resource version"}
//   (410 Gone: the watch's resourceVersion is too old, the client lists again).
// Of a Pod, pdrouter reads metadata (name, namespace, uid, resourceVersion, deletionTimestamp,
// labels, annotations) and status (phase, podIP, the Ready condition). Everything else is
// skipped. Labels and annotations: at most kMaxPodMetadataEntries each are kept, and an entry
// whose key or value is over its limit is dropped (kubectl's last-applied-configuration
// annotation is a whole manifest); the pod still decodes.
// Pure: no I/O. Every decoder bounds what it accepts; `out` is untouched on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

// A whole list answer; one watch-stream line; names, IPs and resource versions; one label or
// annotation key and value; how many labels (and annotations) a pod keeps.
inline constexpr size_t kMaxPodListBytes = 64 * 1024 * 1024;
inline constexpr size_t kMaxPodWatchLineBytes = 4 * 1024 * 1024;
inline constexpr size_t kMaxPodFieldBytes = 256;
inline constexpr size_t kMaxPodMetadataKeyBytes = 317;  // prefix (253) + '/' + name (63)
inline constexpr size_t kMaxPodMetadataValueBytes = 1024;
inline constexpr size_t kMaxPodMetadataEntries = 64;

using PodMetadataMap = std::vector<std::pair<std::string, std::string>>;  // as sent, bounded

struct PodInfo {
  std::string name;
  std::string namespace_name;
  std::string uid;
  std::string resource_version;
  bool deleting = false;  // metadata.deletionTimestamp is set: the pod is shutting down
  PodMetadataMap labels;
  PodMetadataMap annotations;
  std::string phase;   // "Pending", "Running", "Succeeded", "Failed", "Unknown" or ""
  std::string pod_ip;  // status.podIP ("" before the pod has one)
  bool ready = false;  // status.conditions has {"type":"Ready","status":"True"}

  // The value of a label / annotation, or nullptr.
  const std::string* label(std::string_view key) const;
  const std::string* annotation(std::string_view key) const;
};

struct PodList {
  std::string resource_version;  // metadata.resourceVersion: where a watch starts
  std::vector<PodInfo> items;
};

enum class PodEventType : uint8_t { kAdded, kModified, kDeleted, kBookmark, kError };
std::string_view to_string(PodEventType);

struct PodEvent {
  PodEventType type = PodEventType::kAdded;
  PodInfo pod;  // ADDED, MODIFIED, DELETED; BOOKMARK: resource_version only
  // ERROR: the Status object's code (410: too old resource version), reason and message.
  int error_code = 0;
  std::string error_reason;
  std::string error_message;
};

// Errors: kTooLarge (over the byte limit; a name, uid, IP or version over kMaxPodFieldBytes),
// kMalformed (not JSON), kWrongType (a field of the wrong JSON type), kInvalidValue (a missing
// or unknown event type, an event without its object).
Status parse_pod_list(std::string_view json, PodList* out);
Status parse_pod_watch_event(std::string_view json, PodEvent* out);
// A Status object (the body of an HTTP error answer, e.g. 410 or 403): code, reason, message.
Status parse_k8s_status(std::string_view json, int* code, std::string* reason, std::string* message);

// `text` percent-encoded for a URL query value (RFC 3986 unreserved characters kept).
std::string url_query_escape(std::string_view text);

}  // namespace pdr::proto
