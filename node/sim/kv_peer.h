// Where a decode leg finds its prefill's KV side channel: the address the real connector would
// contact, as its dialect says (SimDialect::resolve_peer, node/sim/dialects/), and the plain HTTP
// GET a dialect may need for that (Mooncake's bootstrap /query).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "node/sim/error.h"
#include "node/sim/kv.h"
#include "proto/address.h"

namespace pdr::node::sim {

struct SimDialect;

// blocks.peer_address (what the request said about the prefill) resolved by `dialect`; an empty
// peer address is refused here. Blocking, bounded by `deadline`. Errors are kv_peer_error()s.
std::optional<SimError> resolve_kv_peer(const SimDialect& dialect, const KvBlocks& blocks,
                                        std::chrono::steady_clock::time_point deadline,
                                        proto::HostPort* out);

// 502 kv_peer_unreachable: the decode cannot reach (or find) its prefill's KV.
SimError kv_peer_error(std::string message);

// A bare HTTP/1.0 GET (a bootstrap server's /query); the body on a 200 answer of at most 1 MiB.
// nullopt on success, else why it failed.
std::optional<std::string> http_get(const proto::HostPort& server, const std::string& path,
                                    std::chrono::steady_clock::time_point deadline,
                                    std::string* body);

}  // namespace pdr::node::sim
