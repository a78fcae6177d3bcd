#include "proto/node_spec.h"

namespace pdr::proto {

void fill_parsed_zmq_address(NodeEndpoint* node) {
  if (node->moriio_zmq || node->kv_address || node->zmq_address.empty()) return;
  if (looks_like_moriio_zmq_address(node->zmq_address)) {
    MoriioZmqAddress zmq;
    if (parse_moriio_zmq_address(node->zmq_address, &zmq).is_ok()) node->moriio_zmq = std::move(zmq);
  } else {
    HostPort kv;
    if (parse_host_port(node->zmq_address, &kv).is_ok()) node->kv_address = std::move(kv);
  }
}

}  // namespace pdr::proto
