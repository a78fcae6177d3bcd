// The admin API's untrusted inputs turned into validated values: request bodies (JSON) and the
// instance address in a path. Pure functions, no I/O; the HTTP side is admin_routes.h.
//
// Bodies are strict: at most kMaxAdminBodyBytes, one JSON object, no duplicate or unknown keys,
// every value of its exact type (integers are JSON integers, not strings or 2.0). Instance rules
// (names, addresses, connector-dependent fields, sizes) are the topology file's, shared through
// discovery/config/instance_spec.h, so an instance the file accepts the API accepts and vice versa.
// Errors are kInvalidValue/kWrongType/kMissingKey/... Statuses whose message reads
// "KEY: what is wrong" (or just "what is wrong" for the body as a whole).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"
#include "proto/base/status.h"

namespace pdr::router {

inline constexpr size_t kMaxAdminBodyBytes = 16 * 1024;

// POST /admin/instances: {"role", "http_address" (both required), "connector", "transfer_mode",
// "zmq_address", "dp_size", "tp_size", "bootstrap_port", "kv_events_endpoint",
// "kv_events_replay_endpoint" (tcp://host:port, proto::parse_zmq_tcp_endpoint), "model",
// "labels"}. Absent keys take the
// topology's defaults (`defaults`), exactly as an entry of the file's `instances:` list.
Status parse_admin_instance(std::string_view body, const config::Topology::Connectors& defaults,
                            config::StaticInstance* out);

// POST /instances/add, vLLM's demo proxy body: {"type": "prefill"|"decode", "instance":
// "host:port"}. The instance gets the topology's connector defaults; a default connector that
// needs more than an address (moriio, p2p-nccl need zmq_address) is refused with a message
// pointing at POST /admin/instances. Messages start with the demo proxy's own sentences
// ("Invalid instance type.", "Invalid instance format.", "Invalid instance address.") so scripts
// matching them keep working.
Status parse_seed_add_instance(std::string_view body, const config::Topology::Connectors& defaults,
                               config::StaticInstance* out);

// The {host:port} segment of /admin/instances/{host:port}[/...], percent-decoded ("%5B::1%5D:80"
// is "[::1]:80"), to the registry's canonical key. kBadAddress when it is not an address.
Status parse_instance_key(std::string_view segment, std::string* key);

}  // namespace pdr::router
