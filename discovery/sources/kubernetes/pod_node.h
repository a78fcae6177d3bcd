// How a Kubernetes pod becomes a pdrouter node (Kubernetes pod discovery,
// discovery/sources/kubernetes/pod_watcher.h). Pure: no I/O.
//
// A pod serves when its phase is Running, its Ready condition is True, it has a pod IP, and
// it has a role: by default its role label (kubernetes.role_label, default pdrouter.io/role)
// says prefill or decode; with kubernetes.prefill_selector / decode_selector set, the selector
// its labels match says it. A pod matching both selectors is refused (kRejected: one address
// holds one role in the registry, and a guess would send legs to the wrong kind of server);
// one matching neither is not a node (kNotFound, not an error: e.g. the router's own pods).
// Its node is described by annotations (all optional):
//   pdrouter.io/port             HTTP port (default kubernetes.port)
//   pdrouter.io/connector        moriio | p2p-nccl | nixl | mooncake | sglang
//                                (default connectors.default_connector)
//   pdrouter.io/transfer-mode    READ | WRITE (MoRIIO; default connectors.default_transfer_mode)
//   pdrouter.io/zmq-address      the connector's side channel; "{pod_ip}" is replaced by the IP
//   pdrouter.io/bootstrap-port   Mooncake / SGLang bootstrap port
//   pdrouter.io/model            served model name
//   pdrouter.io/kv-events-port   vLLM KV cache events publisher port (tcp://POD_IP:PORT)
//   pdrouter.io/dp-size, pdrouter.io/tp-size
// The same connector rules as a topology `instances:` entry apply
// (discovery/config/instance_spec.h). A pod with metadata.deletionTimestamp set is kept, draining.
#pragma once

#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "discovery/config/topology.h"
#include "proto/discovery_message.h"
#include "proto/k8s_pods.h"

namespace pdr::discovery::sources::kubernetes {

inline constexpr std::string_view kPodPortAnnotation = "pdrouter.io/port";
inline constexpr std::string_view kPodConnectorAnnotation = "pdrouter.io/connector";
inline constexpr std::string_view kPodTransferModeAnnotation = "pdrouter.io/transfer-mode";
inline constexpr std::string_view kPodZmqAddressAnnotation = "pdrouter.io/zmq-address";
inline constexpr std::string_view kPodBootstrapPortAnnotation = "pdrouter.io/bootstrap-port";
inline constexpr std::string_view kPodModelAnnotation = "pdrouter.io/model";
inline constexpr std::string_view kPodKvEventsPortAnnotation = "pdrouter.io/kv-events-port";
inline constexpr std::string_view kPodDpSizeAnnotation = "pdrouter.io/dp-size";
inline constexpr std::string_view kPodTpSizeAnnotation = "pdrouter.io/tp-size";

// Running, Ready and with a pod IP.
bool pod_is_serving(const proto::PodInfo& pod);

// The role of a pod (see above). Errors: kRejected (both selectors match), kNotFound (neither),
// kMissingKey / kInvalidValue (role label absent or not prefill | decode).
Status pod_role(const proto::PodInfo& pod, const config::Topology::Kubernetes& k8s, proto::Role* out);

// The registration a serving pod stands for (format pdrouter, draining when the pod is being
// deleted, instance_id the pod's uid). Errors (kInvalidValue, kMissingKey, kBadAddress, ...)
// name the label or annotation at fault; the pod is then not a node.
Status pod_registration(const proto::PodInfo& pod, const config::Topology::Kubernetes& k8s,
                        const config::Topology::Connectors& defaults, proto::Registration* out);

}  // namespace pdr::discovery::sources::kubernetes
