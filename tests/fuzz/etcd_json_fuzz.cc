// Fuzzes proto/etcd_json: every etcd answer is untrusted bytes from the network. Properties: no
// crash; decoded keys and values stay within their limits (one over it is refused alone, never
// half read); a decoded key is never empty; a range's last_key (where the next page starts) is
// its last key; the line splitter never yields a line over its limit or containing a newline.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/etcd_json.h"

namespace {

void check_kv(const pdr::proto::EtcdKeyValue& kv) {
  if (kv.key.empty() || kv.key.size() > pdr::proto::kMaxEtcdKeyBytes) std::abort();
  if (kv.value.size() > pdr::proto::kMaxEtcdValueBytes) std::abort();
  // A refused value is never half read.
  if (!kv.refused.empty() && !kv.value.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdr::proto;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  EtcdRangeAnswer range;
  if (parse_etcd_range(text, &range).is_ok()) {
    for (const auto& kv : range.kvs) check_kv(kv);
    // The next page starts after the last key, skipped or not.
    if (range.skipped == 0 && !range.kvs.empty() && range.last_key != range.kvs.back().key) std::abort();
    if (range.kvs.empty() && range.skipped == 0 && !range.last_key.empty()) std::abort();
  }
  EtcdWatchAnswer watch;
  if (parse_etcd_watch(text, &watch).is_ok()) {
    for (const auto& event : watch.events) check_kv(event.kv);
  }
  EtcdLeaseAnswer lease;
  if (parse_etcd_lease(text, &lease).is_ok() && lease.ttl < 0) std::abort();
  EtcdAnswer answer;
  (void)parse_etcd_answer(text, &answer);
  std::string token;
  (void)parse_etcd_token(text, &answer, &token);
  std::string decoded;
  if (base64_decode(text, &decoded) && base64_encode(decoded) != text) std::abort();
  // The splitter over the same bytes cut in two.
  EtcdLineSplitter splitter(64);
  const size_t half = size / 2;
  std::string_view line;
  for (std::string_view part : {text.substr(0, half), text.substr(half)}) {
    if (!splitter.feed(part)) break;
    while (splitter.next_line(&line)) {
      if (line.size() > 64 || line.find('\n') != std::string_view::npos) std::abort();
    }
  }
  return 0;
}
