// Which unknown paths routing.pass_through_unknown may relay to a decode node.
//
// A pass-through request goes to a node on the client's behalf, so it must not reach what only
// an operator may run there. Checked on the normalised path (router/http/request_path.h), the one a node
// routes on, in this order:
//   1. The node admin paths of vLLM and SGLang (kNodeAdminPaths: profiling, cache resets,
//      sleep/wake, weight updates, LoRA loading, pause/abort, elastic scaling, collective RPC,
//      server info) are refused (403 forbidden), even when the allow-list below names them.
//      pdrouter's own profile fan-out (admin listener, admin key) is the way to run the ones it
//      knows.
//   2. routing.pass_through_paths, when set, is an allow-list: a path it does not name is
//      refused (404 not_found; the node never hears of it).
// Paths pdrouter routes itself never get here: the route table answers them (a path of the
// other listener: 404, counted like a refusal here).
//
// Entries match whole paths, case-sensitively (Starlette's routing); an entry ending in "/**"
// also matches every path below it. A trailing '/' of the request path is ignored (Starlette
// redirects "/sleep/" to "/sleep").
//
// Pure; any thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::router::proxy {

enum class PassThroughVerdict {
  kAllowed,
  kNotListed,   // routing.pass_through_paths is set and does not name the path: 404
  kNodeAdmin,   // a node admin path: 403
};

// vLLM (vllm/entrypoints/serve/*/api_router.py: dev, cache, sleep, rpc, rlhf, lora, elastic_ep,
// pause, profile, fault_tolerance) and SGLang (sglang/srt/entrypoints/http_server.py) operator
// endpoints.
extern const std::span<const std::string_view> kNodeAdminPaths;

// True when `path` (normalised) matches `entry` as described above.
bool pass_through_entry_matches(std::string_view entry, std::string_view path);

// `allow`: routing.pass_through_paths (empty: every path not denied).
PassThroughVerdict check_pass_through(std::string_view path, const std::vector<std::string>& allow);

}  // namespace pdr::router::proxy
