// What MoRIIO READ (moriio_read.cc) and MoRIIO WRITE (moriio_write.cc) share (docs/design/wire-formats.md
// 1): transfer_id on both legs, the peer's zmq address from explicit remote_* keys or the request
// id, the prefill's answer, the handshake and notify ports as side channel, and the MoRIIO
// registration format.
#pragma once

#include "node/sim/dialects/common.h"

namespace pdr::node::sim::dialect {

// Both modes' checks; READ adds what its decode needs to READ (moriio_read.cc).
std::optional<SimError> moriio_check_leg(const KvNodeIdentity& node, const std::string& request_id,
                                         const nlohmann::json& body, KvRequest* out);
nlohmann::json moriio_prefill_answer(const KvNodeIdentity& node, const KvRequest& request,
                                     const std::string& internal_id,
                                     const std::vector<int64_t>& blocks);
// {handshake, notify}.
std::vector<SidePortRange> moriio_side_channel(const KvNodeIdentity& node);
// The prefill's handshake port, from its zmq address.
std::optional<SimError> moriio_resolve_peer(const KvBlocks& blocks,
                                            std::chrono::steady_clock::time_point deadline,
                                            proto::HostPort* out);
void moriio_registration(const SimRegistrationInputs& in, proto::Registration* reg);

}  // namespace pdr::node::sim::dialect
