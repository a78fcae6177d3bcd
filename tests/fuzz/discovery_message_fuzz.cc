// libFuzzer target for the discovery-message codec (proto/discovery_message.h).
//
// Besides "no crash, no sanitizer report, no exception", it checks a round-trip property: every
// message that decodes is re-encoded in its own wire shape and decoded again, and the second
// decode must reproduce exactly the same fields (and the same bytes when encoded once more); the
// same bytes read as an etcd registry entry (proto/etcd_registry_entry.h) keep their registration
// and admission class through a round trip.
// Seed corpus: tests/fuzz/corpus/discovery_message/ (tests/fuzz/make_corpus.py).
#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/discovery_message.h"
#include "proto/etcd_registry_entry.h"

namespace {

using pdr::proto::Ack;
using pdr::proto::DecodeLimits;
using pdr::proto::DiscoveryMessage;
using pdr::proto::RegistrationFormat;

DiscoveryMessage decode_or_trap(const std::string& bytes) {
  DiscoveryMessage again;
  if (!pdr::proto::decode_discovery_message(pdr::proto::as_bytes(bytes), DecodeLimits{}, &again)) {
    __builtin_trap();  // our own encoding must always decode
  }
  return again;
}

void check_registration_round_trip(const pdr::proto::Registration& reg) {
  const std::string encoded = pdr::proto::encode_registration(reg);
  const DiscoveryMessage again = decode_or_trap(encoded);
  if (again.kind != DiscoveryMessage::Kind::kRegistration) __builtin_trap();
  if (!(again.registration == reg)) __builtin_trap();
  if (pdr::proto::encode_registration(again.registration) != encoded) __builtin_trap();
}

void check_goodbye_round_trip(const pdr::proto::Goodbye& goodbye) {
  const std::string encoded = pdr::proto::encode_goodbye(goodbye);
  const DiscoveryMessage again = decode_or_trap(encoded);
  if (again.kind != DiscoveryMessage::Kind::kGoodbye) __builtin_trap();
  if (!(again.goodbye == goodbye)) __builtin_trap();
}

void check_ack_round_trip(const Ack& ack) {
  Ack again;
  if (!pdr::proto::decode_ack(pdr::proto::as_bytes(pdr::proto::encode_ack(ack)), &again)) {
    __builtin_trap();
  }
  if (!(again == ack)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  DiscoveryMessage message;
  if (pdr::proto::decode_discovery_message(bytes, DecodeLimits{}, &message)) {
    if (message.kind == DiscoveryMessage::Kind::kRegistration) {
      check_registration_round_trip(message.registration);
    } else if (message.kind == DiscoveryMessage::Kind::kGoodbye) {
      check_goodbye_round_trip(message.goodbye);
    }
  }
  Ack ack;
  if (pdr::proto::decode_ack(bytes, &ack)) check_ack_round_trip(ack);
  // The etcd registry entry (the same registration plus pdr_admission): it decodes exactly when
  // the registration does and the admission field is a short string; re-encoded, it keeps both.
  pdr::proto::EtcdRegistryEntry entry;
  if (pdr::proto::decode_etcd_registry_entry(bytes, DecodeLimits{}, &entry)) {
    if (message.kind != DiscoveryMessage::Kind::kRegistration || !(entry.registration == message.registration)) {
      __builtin_trap();
    }
    const std::string encoded = pdr::proto::encode_etcd_registry_entry(entry.registration, entry.admission);
    pdr::proto::EtcdRegistryEntry again;
    if (!pdr::proto::decode_etcd_registry_entry(pdr::proto::as_bytes(encoded), DecodeLimits{}, &again)) {
      __builtin_trap();
    }
    if (again.admission != entry.admission) __builtin_trap();
    if (pdr::proto::encode_etcd_registry_entry(again.registration, again.admission) != encoded) __builtin_trap();
  }
  return 0;
}
