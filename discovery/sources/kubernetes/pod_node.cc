#include "discovery/sources/kubernetes/pod_node.h"

#include <charconv>

#include "discovery/config/instance_spec.h"
#include "proto/address.h"

namespace pdr::discovery::sources::kubernetes {

namespace {

// The annotation's value as an integer in [min, max]; absent leaves *out alone.
Status annotation_uint(const proto::PodInfo& pod, std::string_view key, uint32_t min, uint32_t max, uint32_t* out) {
  const std::string* text = pod.annotation(key);
  if (text == nullptr) return Status::ok();
  uint32_t value = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (ec != std::errc() || end != text->data() + text->size() || text->empty() || value < min || value > max) {
    return Status(StatusCode::kInvalidValue, "annotation " + std::string(key) + ": expected an integer from " +
                                                 std::to_string(min) + " to " + std::to_string(max));
  }
  *out = value;
  return Status::ok();
}

Status with_annotation(std::string_view key, Status st) {
  if (st) return st;
  return Status(st.code(), "annotation " + std::string(key) + ": " + st.message());
}

}  // namespace

bool pod_is_serving(const proto::PodInfo& pod) {
  return pod.phase == "Running" && pod.ready && !pod.pod_ip.empty();
}

Status pod_role(const proto::PodInfo& pod, const config::Topology::Kubernetes& k8s, proto::Role* out) {
  if (k8s.uses_selectors()) {
    const bool prefill = proto::label_selector_matches(k8s.prefill_selector, pod.labels);
    const bool decode = proto::label_selector_matches(k8s.decode_selector, pod.labels);
    if (prefill && decode) {
      // One pod is one HTTP address, and the registry holds one role per address: guessing
      // would route prefill legs to a decode server or the other way round.
      return Status(StatusCode::kRejected, "its labels match both prefill_selector and decode_selector");
    }
    if (!prefill && !decode) return Status(StatusCode::kNotFound, "its labels match neither selector");
    *out = prefill ? proto::Role::kPrefill : proto::Role::kDecode;
    return Status::ok();
  }
  const std::string* role = pod.label(k8s.role_label);
  if (role == nullptr) return Status(StatusCode::kMissingKey, "no label " + k8s.role_label);
  if (Status st = config::parse_instance_role(*role, out); !st) {
    return Status(st.code(), "label " + k8s.role_label + ": " + st.message());
  }
  return Status::ok();
}

Status pod_registration(const proto::PodInfo& pod, const config::Topology::Kubernetes& k8s,
                        const config::Topology::Connectors& defaults, proto::Registration* out) {
  config::StaticInstance node;
  if (Status st = pod_role(pod, k8s, &node.role); !st) return st;
  uint32_t port = k8s.port;
  if (Status st = annotation_uint(pod, kPodPortAnnotation, 1, 65535, &port); !st) return st;
  if (Status st = proto::parse_host_port(pod.pod_ip + ":" + std::to_string(port), &node.http_address); !st) {
    // parse_host_port wants brackets around an IPv6 address.
    if (Status v6 = proto::parse_host_port("[" + pod.pod_ip + "]:" + std::to_string(port), &node.http_address); !v6) {
      return Status(StatusCode::kBadAddress, "pod IP " + pod.pod_ip.substr(0, 64) + " is not an address");
    }
  }
  node.connector = defaults.default_connector;
  config::InstanceKeysGiven given;
  if (const std::string* text = pod.annotation(kPodConnectorAnnotation)) {
    if (Status st = config::parse_node_connector(*text, &node.connector); !st) {
      return with_annotation(kPodConnectorAnnotation, st);
    }
  }
  if (const std::string* text = pod.annotation(kPodTransferModeAnnotation)) {
    if (Status st = config::parse_instance_transfer_mode(*text, &node.transfer_mode); !st) {
      return with_annotation(kPodTransferModeAnnotation, st);
    }
    given.transfer_mode = true;
  }
  if (const std::string* text = pod.annotation(kPodZmqAddressAnnotation)) {
    std::string zmq = *text;
    for (size_t at = zmq.find("{pod_ip}"); at != std::string::npos; at = zmq.find("{pod_ip}", at + pod.pod_ip.size())) {
      zmq.replace(at, 8, pod.pod_ip);
    }
    node.zmq_address = std::move(zmq);
    given.zmq_address = true;
  }
  if (pod.annotation(kPodBootstrapPortAnnotation) != nullptr) {
    uint32_t bootstrap = 0;
    if (Status st = annotation_uint(pod, kPodBootstrapPortAnnotation, 1, 65535, &bootstrap); !st) return st;
    node.bootstrap_port = static_cast<uint16_t>(bootstrap);
  }
  if (const std::string* model = pod.annotation(kPodModelAnnotation)) node.model = *model;
  if (pod.annotation(kPodKvEventsPortAnnotation) != nullptr) {
    uint32_t kv_port = 0;
    if (Status st = annotation_uint(pod, kPodKvEventsPortAnnotation, 1, 65535, &kv_port); !st) return st;
    node.kv_events_endpoint = proto::HostPort{node.http_address.host, static_cast<uint16_t>(kv_port)};
  }
  if (Status st = annotation_uint(pod, kPodDpSizeAnnotation, 1, config::kMaxParallelSize, &node.dp_size); !st) {
    return st;
  }
  if (Status st = annotation_uint(pod, kPodTpSizeAnnotation, 1, config::kMaxParallelSize, &node.tp_size); !st) {
    return st;
  }
  std::string_view field;
  if (Status st = config::check_instance_connector_fields(defaults, given, &node, &field); !st) {
    if (field == "zmq_address") return with_annotation(kPodZmqAddressAnnotation, st);
    if (field == "transfer_mode") return with_annotation(kPodTransferModeAnnotation, st);
    return st;
  }
  proto::fill_parsed_zmq_address(&node);

  proto::Registration reg;
  static_cast<proto::NodeSpec&>(reg) = node;
  reg.format = proto::RegistrationFormat::kPdrouter;
  reg.schema_version = 1;
  reg.instance_id = pod.uid.substr(0, 128);
  reg.draining = pod.deleting;
  *out = std::move(reg);
  return Status::ok();
}

}  // namespace pdr::discovery::sources::kubernetes
