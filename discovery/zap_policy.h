// The admission decision libzmq asks for at each discovery connection's handshake (ZAP, RFC 27).
// Pure: the discovery thread feeds it the request frames and sends back its answer, so a refused
// peer never gets a message into the registry (libzmq closes the connection after the refusal).
//
// Two ZAP domains, one per discovery socket:
//   kPlainDomain  NULL mechanism (plain vLLM nodes): the peer address must be in allowed_peers.
//   kCurveDomain  CURVE mechanism: with allowed_client_keys configured, the client's public key
//                 must be one of them (any address); without, the address must be in allowed_peers
//                 (the connection is then encrypted but the sender is only address-admitted).
// The answer's user id tells the message handler how the peer was admitted (user_id_class()).
// Handshakes that fail before ZAP is asked (wrong mechanism, wrong CURVE server key) are seen on
// the sockets' monitors and counted with the same refusals (handshake_failure_refusal()).
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/config/admission.h"

namespace pdr::discovery {

inline constexpr std::string_view kPlainDomain = "pdr-plain";
inline constexpr std::string_view kCurveDomain = "pdr-curve";

enum class HandshakeRefusal : uint8_t {
  kAddressNotAllowed,  // peer address outside discovery.allowed_peers
  kKeyNotAllowed,      // CURVE client key not in discovery.curve.allowed_client_keys
  kWrongMechanism,     // e.g. a CURVE client on the plain socket's domain, or the reverse
  kMalformed,          // a ZAP request that does not follow RFC 27
  // Failed before ZAP is asked (libzmq's handshake-failure events, handshake_failure_refusal):
  kWrongServerKey,     // a CURVE client's HELLO does not decrypt with this server's key
  kProtocolError,      // any other ZMTP or CURVE handshake error (a garbled greeting, ...)
  kCount
};
std::string_view to_string(HandshakeRefusal);  // "address_not_allowed", "key_not_allowed", ...
constexpr size_t kHandshakeRefusals = static_cast<size_t>(HandshakeRefusal::kCount);

struct ZapPolicy {
  config::AllowList allowed_peers;
  std::set<std::string> allowed_client_keys;  // Z85; empty = CURVE clients admitted by address
  bool plain_is_local = false;  // the plain endpoint is ipc://: no address to check, admit

  // The class a connection admitted by address gets: kOpen when the list admits everyone.
  config::AdmissionClass address_class() const {
    return allowed_peers.matches_everything() ? config::AdmissionClass::kOpen : config::AdmissionClass::kAddress;
  }
};

struct ZapDecision {
  bool allow = false;
  HandshakeRefusal refusal = HandshakeRefusal::kMalformed;  // when !allow
  std::string user_id;      // when allow: "address" or "curve:<Z85 key>"
  std::string status_text;  // for the ZAP reply and the log
};

// frames: the ZAP request as received (version, request id, domain, address, routing id,
// mechanism, credentials...).
ZapDecision decide_zap(const ZapPolicy& policy, const std::vector<std::string>& frames);

// The ZAP reply frames for a request id and decision (version "1.0", id, 200/400, text, user id,
// empty metadata).
std::array<std::string, 6> zap_reply(std::string_view request_id, const ZapDecision& decision);

// The refusal a handshake that failed inside libzmq counts as, from the value of its
// ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL monitor event (a ZMQ_PROTOCOL_ERROR_* code). These never
// reach the ZAP handler: a NULL client on the CURVE endpoint (or the reverse) is kWrongMechanism,
// a CURVE client with the wrong server key kWrongServerKey, anything else kProtocolError.
HandshakeRefusal handshake_failure_refusal(uint32_t zmq_protocol_error);

// How a message's sender was admitted, from its connection's user id (the "User-Id" message
// property libzmq attaches after ZAP): kCurve for "curve:..."; otherwise `address_class`.
config::AdmissionClass user_id_class(std::string_view user_id, config::AdmissionClass address_class);

}  // namespace pdr::discovery
