// CURVE key files for the discovery socket (libzmq's CurveZMQ; no crypto of our own).
//
// Accepted file forms, so keys made by any usual tool work:
//   - a bare Z85 key: one line of 40 characters (what zmq_curve_keypair() prints);
//   - a ZPL certificate as pyzmq's zmq.auth.create_certificates() and czmq write:
//       curve
//           public-key = "<40 chars>"
//           secret-key = "<40 chars>"
//   `pdnode keygen` writes both files in the certificate form.
#pragma once

#include <string>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

struct CurveKeyPair {
  std::string public_z85;  // 40 characters
  std::string secret_z85;  // 40 characters; never logged
};

// Generates a fresh key pair with zmq_curve_keypair(). kInternal if libzmq lacks CURVE.
Status generate_curve_key_pair(CurveKeyPair* out);

// Parses a file's text holding a secret key (bare, or a certificate's secret-key); the public key
// is derived from it (zmq_curve_public), so the secret alone is enough.
Status parse_curve_secret_key(std::string_view text, CurveKeyPair* out);
// Parses a file's text holding one public key (bare, or a certificate's public-key).
Status parse_curve_public_key(std::string_view text, std::string* z85_out);
// Parses a list of allowed public keys: one bare Z85 key per line, or certificates' public-key
// lines; '#' starts a comment. Duplicates are dropped. At most 100,000 keys.
Status parse_curve_public_keys(std::string_view text, std::vector<std::string>* z85_out);

// Certificate text for a key pair: with the secret (for the owner) or public only (to hand out).
std::string curve_certificate(const CurveKeyPair& keys, bool include_secret);

// Z85 text of a 32-byte key (as a ZAP request carries it), or "" if `bytes` is not 32 bytes.
std::string curve_key_z85(std::string_view bytes);

}  // namespace pdr::proto
