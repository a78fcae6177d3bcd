// Where a decode leg finds its prefill's KV side channel, per connector dialect: the address the
// real connector would contact (shared/PROTOCOLS.md).
//   MoRIIO    the prefill's handshake port (from remote_host/remote_handshake_port or the
//             request id's ___prefill_addr_ zmq address)
//   NIXL      remote_host:remote_port (the side channel; remote_port already includes the DP rank)
//   P2P-NCCL  the prefill's ip:port from the request id
//   Mooncake  GET /query on remote_bootstrap_addr, then the worker_addr of the DP rank whose
//             engine_id is remote_engine_id (TP rank 0)
//   SGLang    bootstrap_host:bootstrap_port (the sim's prefill serves the side channel there)
// Blocking (Mooncake's /query is an HTTP GET on a plain socket), bounded by `deadline`.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "node/sim_error.h"
#include "node/sim_kv.h"
#include "proto/address.h"

namespace pdr::node::sim {

std::optional<SimError> resolve_kv_peer(proto::Connector connector, const KvBlocks& blocks,
                                        std::chrono::steady_clock::time_point deadline,
                                        proto::HostPort* out);

// A bare HTTP/1.0 GET, for Mooncake's bootstrap /query; the body on a 200 answer of at most
// 1 MiB. nullopt on success, else why it failed.
std::optional<std::string> http_get(const proto::HostPort& server, const std::string& path,
                                    std::chrono::steady_clock::time_point deadline,
                                    std::string* body);

}  // namespace pdr::node::sim
