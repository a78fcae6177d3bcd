// libFuzzer target for the RDMA handshake record and region key codecs (proto/rdma_handshake.h).
//
// Besides "no crash, no sanitizer report", it checks: every record that decodes validates, and
// re-encodes to the exact input bytes (the format has no redundancy or optional parts) which decode
// again to the same record; every accepted region key re-encodes to its input. Inputs whose first
// byte is 'K' also go to the region key decoder (without the 'K').
// Seed corpus: tests/fuzz/corpus/rdma_handshake/.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "proto/rdma_handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  if (size > 0 && data[0] == 'K') {
    pdr::proto::RdmaRegionKey key;
    if (pdr::proto::decode_rdma_region_key(bytes.subspan(1), &key)) {
      const std::string encoded = pdr::proto::encode_rdma_region_key(key);
      if (encoded.size() != size - 1 || std::memcmp(encoded.data(), data + 1, size - 1) != 0) {
        __builtin_trap();
      }
    }
  }
  pdr::proto::RdmaHandshake record;
  if (!pdr::proto::decode_rdma_handshake(bytes, &record)) return 0;
  if (!pdr::proto::validate_rdma_handshake(record)) __builtin_trap();
  if (record.qpn.size() != record.psn.size() || record.qpn.empty()) __builtin_trap();
  const std::string encoded = pdr::proto::encode_rdma_handshake(record);
  if (encoded.size() != size || std::memcmp(encoded.data(), data, size) != 0) __builtin_trap();
  pdr::proto::RdmaHandshake again;
  if (!pdr::proto::decode_rdma_handshake(std::as_bytes(std::span(encoded)), &again)) {
    __builtin_trap();
  }
  if (!(again == record)) __builtin_trap();
  return 0;
}
