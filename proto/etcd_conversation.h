// Multi-turn entries shared through etcd: when registry.backend is etcd and multi_turn is on, a
// stored conversation entry (router/routing/conversation_cache.h) is also put under
//   <prefix>conversations/<binding>/<conversation id in unpadded base64url>
// so the next turn of the conversation can take it on any replica. <binding> is the client's
// binding (router/routing/conversation_binding.h) as text: "anonymous", or the digest's
// kConversationBindingBytes bytes in lower-case hex; the credential itself never reaches etcd.
// The value is a small JSON object:
//   {"writer":"<replica id>","binding":"<binding>","decode":"<decode key>","epoch":N,
//    "expires_ms":N,"params":{...}}
// writer: the replica that stored it (a replica marks entries it did not write as remote);
// binding: the key's binding again (an entry whose two differ is refused);
// decode/epoch: the decode that holds the conversation's KV and its epoch then; expires_ms: wall
// clock (Unix ms) after which the entry must not be used (replicas' steady clocks differ);
// params: the next turn's prefill kv_transfer_params (proto/multi_turn.h), a JSON object.
// Flow (router/conversation_mirror.h, discovery/sources/etcd/registry_replicator.h): the writer puts
// the entry on the replicator's thread with a lease covering etcd_conversation_lease_seconds(
// multi_turn ttl); every replica mirrors the prefix into its ConversationCache (entries of other
// writers marked remote); taking an entry removes it locally and deletes the key (the delete
// removes it on the other replicas). Two replicas taking the same entry at
// once both hand it to a prefill: one pull of the decode's blocks fails and that prefill
// recomputes (vLLM and the sims handle it), so the race costs a recompute, never an error.
// Entries of replicas from before bindings (a key <prefix>conversations/<id> with no binding
// segment, a value with no "binding") are refused like any malformed entry: such an entry could
// belong to any client. Replicas from before bindings refuse the new keys in turn (their
// segment is not base64url), so during a rolling upgrade turns are not shared between the two
// versions (each still reuses its own entries).
// Pure: no I/O. Values and keys come from etcd (untrusted): every decoder bounds what it accepts
// and leaves `out` untouched on error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::proto {

// Limits on what a conversation entry may hold (the cache's max_bytes bounds the total).
inline constexpr size_t kMaxConversationIdBytes = 1024;
inline constexpr size_t kMaxConversationValueBytes = 256 * 1024;
// A binding that is not anonymous is a digest of this many bytes.
inline constexpr size_t kConversationBindingBytes = 32;

struct EtcdConversationEntry {
  std::string writer;          // replica id of the replica that stored the entry
  std::string binding;         // the client's binding: "" anonymous, else kConversationBindingBytes bytes
  std::string decode_key;      // the decode instance that holds the conversation's KV
  uint64_t decode_epoch = 0;   // its epoch when the entry was stored
  int64_t expires_unix_ms = 0; // not usable at or after this wall-clock time
  std::string prefill_params;  // raw JSON object text
};

// Unpadded base64url (RFC 4648 section 5): an id of any bytes becomes one safe key segment.
std::string base64url_encode(std::string_view bytes);
// Strict: base64url alphabet, no padding, no whitespace, no non-zero trailing bits. False else.
bool base64url_decode(std::string_view text, std::string* out);

// A binding as text ("anonymous" or lower-case hex), and back: false for any other text (upper
// case hex, another length).
std::string conversation_binding_text(std::string_view binding);
bool parse_conversation_binding_text(std::string_view text, std::string* binding);

// "<prefix>conversations/" and the key of one conversation under it.
std::string etcd_conversations_prefix(std::string_view prefix);
std::string etcd_conversation_key(std::string_view prefix, std::string_view binding, std::string_view conversation_id);
// The binding and conversation id of a key under etcd_conversations_prefix(prefix). kInvalidValue
// for a key outside it, kMalformed for a key without a binding segment (an entry from before
// bindings), a binding that is not one, or an id segment that is not base64url; kTooLarge for an
// id over the limit.
Status parse_etcd_conversation_key(std::string_view prefix, std::string_view key, std::string* binding,
                                   std::string* conversation_id);

std::string encode_etcd_conversation(const EtcdConversationEntry& entry);
// kTooLarge (value over kMaxConversationValueBytes, or a field over its limit), kMalformed (not
// a JSON object, or a number beyond what JSON parsing accepts), kTooDeep, kMissingKey,
// kWrongType (params not an object, epoch not an unsigned integer), kInvalidValue (empty
// decode, a binding that is not one), kOutOfRange (expires_ms not positive). kMissingKey covers
// an entry without "binding" (from before bindings).
Status parse_etcd_conversation(std::string_view value, EtcdConversationEntry* out);

// What a watch DELETE of a conversation key does to this replica's own entry for it. A take on
// another replica deletes the key; if this replica stored a newer entry for the conversation
// meanwhile, that delete can reach its watch after its own put was applied, and must not remove
// the newer entry. etcd revisions order them: `delete_revision` is the delete event's
// mod_revision, `put_revision` the revision etcd answered this replica's last put of the key with
// (0: none known, e.g. an entry of another writer), `put_in_flight` whether a put of the key is
// sent and not yet answered (its revision unknown: decided when it is).
enum class ConversationDeleteVerdict : uint8_t {
  kApply,   // remove the entry (a take of this entry, or of one nobody knows newer)
  kIgnore,  // older than this replica's put: the entry it removed is not the one held here
  kDefer,   // a put in flight: apply once its revision is known and older than the delete
};
ConversationDeleteVerdict etcd_conversation_delete_verdict(int64_t delete_revision, int64_t put_revision,
                                                           bool put_in_flight);
// The same rule for a watch PUT of another writer: one made before this replica's own answered
// put of the key (`put_revision`, 0: none) is stale and must not replace the newer local entry.
bool etcd_conversation_put_is_stale(int64_t put_event_revision, int64_t put_revision);

// The TTL, in whole seconds, of an etcd lease that keeps an entry at least `ttl_ms` (rounded up,
// at least 1 s, etcd's own minimum aside): the conversation keys' lease must cover multi_turn's
// TTL, so a replica's own lease is reusable only when its TTL is at least this.
int64_t etcd_conversation_lease_seconds(int64_t ttl_ms);

}  // namespace pdr::proto
