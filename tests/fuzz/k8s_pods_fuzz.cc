// Fuzzes proto/k8s_pods: every Kubernetes API answer is untrusted bytes from the network.
// Properties: no crash; every kept string, label and annotation stays within its limit; a
// decoded ADDED/MODIFIED/DELETED event names its pod; a Status code is 0..999.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/k8s_pods.h"

namespace {

using namespace pdr::proto;

void check_map(const PodMetadataMap& map) {
  if (map.size() > kMaxPodMetadataEntries) std::abort();
  for (const auto& [k, v] : map) {
    if (k.size() > kMaxPodMetadataKeyBytes || v.size() > kMaxPodMetadataValueBytes) std::abort();
  }
}

void check_pod(const PodInfo& pod) {
  for (const std::string* s : {&pod.name, &pod.namespace_name, &pod.uid, &pod.resource_version, &pod.phase,
                               &pod.pod_ip}) {
    if (s->size() > kMaxPodFieldBytes) std::abort();
  }
  check_map(pod.labels);
  check_map(pod.annotations);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  PodEvent event;
  if (parse_pod_watch_event(text, &event).is_ok()) {
    check_pod(event.pod);
    if (event.type != PodEventType::kBookmark && event.type != PodEventType::kError && event.pod.name.empty()) {
      std::abort();
    }
    if (event.error_code < 0 || event.error_code > 999) std::abort();
  }
  PodList list;
  if (parse_pod_list(text, &list).is_ok()) {
    for (const auto& pod : list.items) check_pod(pod);
  }
  int code = 0;
  std::string reason, message;
  if (parse_k8s_status(text, &code, &reason, &message).is_ok() && (code < 0 || code > 999)) std::abort();
  const std::string escaped = url_query_escape(text);
  for (const char c : escaped) {
    const bool unreserved = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                            c == '.' || c == '_' || c == '~' || c == '%';
    if (!unreserved) std::abort();
  }
  return 0;
}
