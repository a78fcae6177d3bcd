#include "discovery/zap_policy.h"

#include <fmt/format.h>
#include <zmq.h>

#include "proto/curve_keys.h"

namespace pdr::discovery {
namespace {

constexpr std::string_view kCurveUserPrefix = "curve:";

ZapDecision refuse(HandshakeRefusal why, std::string text) {
  return ZapDecision{false, why, "", std::move(text)};
}

ZapDecision admit_by_address(const ZapPolicy& policy, std::string_view address) {
  auto ip = config::parse_ip_address(address);
  if (!ip) return refuse(HandshakeRefusal::kAddressNotAllowed, fmt::format("unparseable peer address '{}'", address));
  if (!policy.allowed_peers.contains(*ip)) {
    return refuse(HandshakeRefusal::kAddressNotAllowed,
                  fmt::format("peer {} is not in discovery.allowed_peers", address));
  }
  return ZapDecision{true, HandshakeRefusal::kCount, "address", "OK"};
}

}  // namespace

std::string_view to_string(HandshakeRefusal r) {
  switch (r) {
    case HandshakeRefusal::kAddressNotAllowed: return "address_not_allowed";
    case HandshakeRefusal::kKeyNotAllowed: return "key_not_allowed";
    case HandshakeRefusal::kWrongMechanism: return "wrong_mechanism";
    case HandshakeRefusal::kMalformed: return "malformed";
    case HandshakeRefusal::kWrongServerKey: return "wrong_server_key";
    case HandshakeRefusal::kProtocolError: return "protocol_error";
    case HandshakeRefusal::kCount: break;
  }
  return "unknown";
}

ZapDecision decide_zap(const ZapPolicy& policy, const std::vector<std::string>& frames) {
  if (frames.size() < 6 || frames[0] != "1.0") return refuse(HandshakeRefusal::kMalformed, "malformed ZAP request");
  const std::string& domain = frames[2];
  const std::string& address = frames[3];
  const std::string& mechanism = frames[5];
  if (domain == kPlainDomain) {
    if (mechanism != "NULL") {
      return refuse(HandshakeRefusal::kWrongMechanism, fmt::format("mechanism {} on the plain endpoint", mechanism));
    }
    if (policy.plain_is_local) return ZapDecision{true, HandshakeRefusal::kCount, "address", "OK"};
    return admit_by_address(policy, address);
  }
  if (domain == kCurveDomain) {
    if (mechanism != "CURVE" || frames.size() != 7) {
      return refuse(HandshakeRefusal::kWrongMechanism, fmt::format("mechanism {} on the CURVE endpoint", mechanism));
    }
    if (policy.allowed_client_keys.empty()) return admit_by_address(policy, address);
    std::string key = proto::curve_key_z85(frames[6]);
    if (key.empty()) return refuse(HandshakeRefusal::kMalformed, "CURVE credential is not a 32-byte key");
    if (!policy.allowed_client_keys.contains(key)) {
      return refuse(HandshakeRefusal::kKeyNotAllowed,
                    fmt::format("CURVE client key {} from {} is not in discovery.curve.allowed_client_keys",
                                key, address));
    }
    return ZapDecision{true, HandshakeRefusal::kCount, std::string(kCurveUserPrefix) + key, "OK"};
  }
  return refuse(HandshakeRefusal::kMalformed, fmt::format("unknown ZAP domain '{}'", domain));
}

std::array<std::string, 6> zap_reply(std::string_view request_id, const ZapDecision& d) {
  return {"1.0", std::string(request_id), d.allow ? "200" : "400", d.allow ? "OK" : d.status_text,
          d.allow ? d.user_id : "", ""};
}

HandshakeRefusal handshake_failure_refusal(uint32_t zmq_protocol_error) {
  switch (zmq_protocol_error) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH: return HandshakeRefusal::kWrongMechanism;
    // libzmq's CURVE server reports this when the client's HELLO box does not open: it was
    // sealed for another server key.
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC: return HandshakeRefusal::kWrongServerKey;
    default: return HandshakeRefusal::kProtocolError;
  }
}

config::AdmissionClass user_id_class(std::string_view user_id, config::AdmissionClass address_class) {
  return user_id.substr(0, kCurveUserPrefix.size()) == kCurveUserPrefix ? config::AdmissionClass::kCurve : address_class;
}

}  // namespace pdr::discovery
