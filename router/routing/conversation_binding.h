// Which client a multi-turn conversation entry belongs to (topology multi_turn.bind_to). A
// conversation_id is chosen by the client and may be guessed or reused by another client; the
// entries of conversation_cache.h are therefore keyed by (binding, conversation_id), where the
// binding is derived from the client's credential: another client's turn with the same id has
// another binding, so it neither pulls this client's KV into its prefill nor leaves its own KV
// for this client's next turn.
//
// A binding is "" (anonymous: the request carries no credential, or bind_to is none) or the
// kBindingBytes bytes of SHA-256 over a fixed label, the credential's source and the credential
// (HMAC-SHA256 keyed with multi_turn.binding_secret when one is set). It depends only on the
// credential and the configuration, never on the process: every replica sharing entries through
// etcd computes the same one. The credential itself is never kept, logged or sent anywhere; only
// its digest is (and the digest reaches etcd: a binding secret keeps a reader of etcd from
// testing guessed credentials against it).
//
// Pure (OpenSSL's digests only); any thread.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"

namespace pdr::router::routing {

inline constexpr size_t kBindingBytes = 32;

// The binding of a request under `config`: `authorization` is the client's Authorization header
// ("" if none), `bind_header_value` the value of multi_turn.bind_header ("" if none or not
// read). An empty credential is anonymous. nullopt: OpenSSL could not hash (out of memory); the
// caller then gives the request no multi-turn reuse.
std::optional<std::string> conversation_binding(const config::Topology::MultiTurn& config,
                                                std::string_view authorization, std::string_view bind_header_value);

}  // namespace pdr::router::routing
