// Validation of the two listener address forms a topology names. Pure string checks: nothing here
// resolves names or binds sockets. Errors carry no file position; the caller attaches one.
#pragma once

#include <string_view>

#include "proto/address.h"
#include "proto/base/status.h"

namespace pdr::config {

// "host:port" for the HTTP listener, where port 0 means "any free port" (tests bind ephemeral
// ports). Fills *out on success; kOutOfRange for a port above 65535, else proto::parse_host_port's
// errors.
Status parse_listen_address(std::string_view text, proto::HostPort* out);

// A ZMQ endpoint to bind: tcp://HOST:PORT, tcp://*:PORT (PORT may be 0 or * for ephemeral) or
// ipc://PATH (at most 107 bytes). kBadAddress or kOutOfRange when it is none of those.
Status validate_zmq_endpoint(std::string_view text);

}  // namespace pdr::config
