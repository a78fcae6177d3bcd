// The RDMA backend (TRANSFER.md 2.2, R-1..R-16): one-sided RDMA WRITE/READ over RC QPs, behind the
// VerbsApi seam (verbs_api.h): the caller injects the table's loader, the real libibverbs
// (rdma::load_verbs_api) in every product binary, the in-process fake NIC in tests.
//
// Shape:
// - start(): load verbs (the injected loader), open the device (options.device, or the first), one PD, one CQ (no
//   completion channel yet: the I/O thread polls, then naps briefly when idle), pick the GID
//   (gid_rank.h), bind the control listener. No library or no device: kIoError "rdma unavailable:
//   ...", so the engine leaves this backend out.
// - local_address() is "advertise_host:port" (advertise_host defaulting to listen_host) of the
//   control listener (see control_socket.h
//   for why it is not the TCP backend's port).
// - on_region_registered() registers an MR (LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ); region_keys()
//   returns its rkey blob (proto::encode_rdma_region_key: rkey + remote address).
// - Connections are one-directional: the initiator connects to the target's control port on the
//   first submit to a peer, both sides create qps_per_peer RC QPs and exchange a handshake record
//   (their agent names included). Tasks queued before the connection is up wait for it; a failed
//   connect fails them kPeerGone and backs off before the next attempt.
// - Data path: segments cut into slices of at most slice_bytes, spread round-robin over the QPs,
//   one chained post_send per QP per round, sq_sig_all=0 with every signal_every-th WR and the
//   last WR of each task on each QP signaled; outstanding WRs per QP <= max_send_wr, outstanding
//   READs per QP <= the negotiated rd_atomic depth; beyond that, tasks wait in FIFO order.
// - Notify (R-13 option B): once every data WR of a task has completed, a SEND on QP 0 carries
//   {xfer_id, message}; the target delivers on_notification(initiator agent, message) and replies
//   with a SEND; the reply finishes the task kDone. At most notify_slots notifies are in flight
//   per connection (each side keeps that many receives posted on QP 0, so no RNR).
// - Errors: an error CQE fails the task whose WR failed (IBV_WC_REM_ACCESS_ERR: kAccess,
//   else kPeerGone) and every other task of that connection kPeerGone; the QPs are moved to ERR and
//   destroyed (after ibv_destroy_qp the NIC no longer touches their buffers, so tasks may finish
//   at once) and the next submit re-handshakes. Control-socket EOF has the same effect.
// - The serving side's bounds checks are the NIC's MR checks (a one-sided op never reaches our
//   code); the target counts bad_frames for notify messages that do not decode.
//
// Threads: an I/O thread (io_thread.h: posts, polls the CQ, handles cancels, finishes tasks,
// delivers notifications), a connector thread (connector_thread.h: initiator handshakes, so
// submit() and the I/O thread never wait on the network) and a control thread (control_thread.h:
// accepts and answers handshakes, watches control sockets), sharing one lock (backend_state.h).
// finish() runs on any of them, without the backend lock held (remove_peer() and stop() finish on
// the caller's thread); on_notification runs on the I/O thread.
//
// Parts, by lifetime: device.h (start() to stop()), connection.h (a handshake to its teardown),
// task_state.h (submit() to finish()); the data path is posting.h and completions.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transfer/backend.h"
#include "transfer/rdma/verbs_api.h"

namespace pdr::transfer {

struct RdmaBackendOptions {
  std::string device;                 // device name; empty: the first
  int gid_index = -1;                 // -1: choose by gid_rank.h
  std::uint32_t qps_per_peer = 4;     // 1..64
  std::string listen_host = "127.0.0.1";
  std::string advertise_host;         // host in local_address(); empty: listen_host
  std::uint16_t control_port = 0;     // 0: any free port
  std::uint32_t max_send_wr = 256;    // per QP
  std::uint32_t signal_every = 0;     // 0: max_send_wr / 4
  std::uint64_t slice_bytes = 1u << 20;
  std::uint32_t notify_slots = 32;    // notifies in flight per connection
  std::size_t max_notify_bytes = 4096;
  std::uint32_t cq_depth = 65536;     // bounds the QPs one backend can hold
  std::uint32_t connect_timeout_ms = 3000;
};

// `load_verbs` yields the verbs table at start(): rdma::load_verbs_api for the real library.
std::unique_ptr<Backend> make_rdma_backend(const RdmaBackendOptions& options,
                                           rdma::VerbsLoader load_verbs);

}  // namespace pdr::transfer
