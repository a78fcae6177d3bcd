// Fuzzes proto/etcd_session: session bindings read from etcd are untrusted bytes another writer
// put there. Properties: no crash; a value that decodes has non-empty, bounded, printable node
// keys, a binding that is anonymous or a whole digest and a positive expiry, and encodes back to
// a value that decodes to the same entry; a key that decodes gives an id within its limit that
// encodes back to the same key.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/etcd_conversation.h"
#include "proto/etcd_session.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdr::proto;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  EtcdSessionEntry e;
  if (parse_etcd_session(text, &e).is_ok()) {
    if (e.prefill_key.empty() || e.decode_key.empty() || e.expires_unix_ms <= 0) std::abort();
    if (!e.binding.empty() && e.binding.size() != kConversationBindingBytes) std::abort();
    EtcdSessionEntry again;
    if (!parse_etcd_session(encode_etcd_session(e), &again).is_ok()) std::abort();
    if (again.writer != e.writer || again.binding != e.binding || again.prefill_key != e.prefill_key ||
        again.decode_key != e.decode_key || again.expires_unix_ms != e.expires_unix_ms) {
      std::abort();
    }
  }
  std::string binding, id;
  if (parse_etcd_session_key("/pdr/", text, &binding, &id).is_ok()) {
    if (id.empty() || id.size() > kMaxSessionIdBytes) std::abort();
    if (etcd_session_key("/pdr/", binding, id) != text) std::abort();
  }
  return 0;
}
