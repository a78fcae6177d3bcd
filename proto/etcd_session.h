// Session affinity bindings shared through etcd (registry.backend: etcd with session_affinity on;
// router/session_mirror.h): each binding a replica makes is put under
//   <prefix>conversations/session/<binding>/<session id in unpadded base64url>
// (inside the conversations prefix, which the registry replicator already ranges and watches;
// "session" is neither "anonymous" nor a hex digest, so it never reads as a conversation's
// binding segment). <binding> is the client's binding as text, as for conversations
// (proto/etcd_conversation.h): the credential never reaches etcd. The value:
//   {"writer":"<replica id>","binding":"<binding>","prefill":"<key>","decode":"<key>","expires_ms":N}
// writer: the replica that bound it; binding: the key's again (an entry whose two differ is
// refused); prefill/decode: the instance keys of the pair; expires_ms: wall clock (Unix ms)
// after which the binding must not be used.
// Pure: no I/O. Keys and values come from etcd (untrusted): every decoder bounds what it accepts
// and leaves `out` untouched on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::proto {

inline constexpr size_t kMaxSessionIdBytes = 1024;
inline constexpr size_t kMaxSessionValueBytes = 4096;

struct EtcdSessionEntry {
  std::string writer;       // replica id
  std::string binding;      // "" anonymous, else kConversationBindingBytes bytes
  std::string prefill_key;  // non-empty, printable ASCII
  std::string decode_key;
  int64_t expires_unix_ms = 0;
};

// "<prefix>conversations/session/" and one session's key under it.
std::string etcd_sessions_prefix(std::string_view prefix);
std::string etcd_session_key(std::string_view prefix, std::string_view binding, std::string_view session_id);
// kInvalidValue for a key outside etcd_sessions_prefix(prefix); kMalformed for a binding or id
// segment that is not one; kTooLarge for an id over kMaxSessionIdBytes.
Status parse_etcd_session_key(std::string_view prefix, std::string_view key, std::string* binding,
                              std::string* session_id);

std::string encode_etcd_session(const EtcdSessionEntry& entry);
// kTooLarge, kMalformed, kMissingKey, kWrongType, kInvalidValue (empty or non-printable node
// key, a binding that is not one), kOutOfRange (expires_ms not positive).
Status parse_etcd_session(std::string_view value, EtcdSessionEntry* out);

}  // namespace pdr::proto
