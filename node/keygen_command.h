// `pdnode keygen`: makes a CURVE key pair for the discovery socket (libzmq's zmq_curve_keypair),
// written as two ZPL certificates: PREFIX.key (public + secret, mode 0600) and PREFIX.pub (public
// only, to hand out). The router reads PREFIX.key as discovery.curve.secret_key_file and nodes get
// PREFIX.pub as --curve-server-key; a node's own PREFIX.pub goes into the router's
// discovery.curve.allowed_client_keys_file.
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace pdr::node {

struct KeygenFlags {
  std::string prefix;
  bool force = false;
};

CLI::App* add_keygen_command(CLI::App& app, KeygenFlags* flags);
int run_keygen_command(const KeygenFlags& flags);

}  // namespace pdr::node
