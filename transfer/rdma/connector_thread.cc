// The initiator side of the RDMA handshake (contract: connector_thread.h).
#include "transfer/rdma/connector_thread.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <span>

namespace pdr::transfer::rdma {

void ConnectorThread::run() {
  for (;;) {
    std::optional<PeerId> to_connect;
    {
      std::unique_lock lock(state_.mu);
      state_.connect_cv.wait_for(lock, std::chrono::milliseconds(10), [this] {
        return state_.stopping || state_.connect_pending;
      });
      state_.connect_pending = false;
      if (state_.stopping) return;
      const auto now = ControlClock::now();
      for (auto& [id, peer] : state_.peers) {
        if (peer.conn_gen == 0 && !peer.waiting.empty() && now >= peer.retry_after) {
          to_connect = id;
          break;
        }
      }
    }
    if (to_connect) connect_peer(*to_connect);
  }
}

void ConnectorThread::connect_peer(PeerId peer_id) {
  std::vector<Finished> finished;
  std::uint32_t gen = 0;
  std::string address;
  std::string record;
  {
    std::lock_guard lock(state_.mu);
    auto it = state_.peers.find(peer_id);
    if (it == state_.peers.end() || it->second.conn_gen != 0 || state_.stopping) return;
    Connection* conn = nullptr;
    if (Status s = state_.create_conn(false, state_.options.qps_per_peer, &conn); !s) {
      state_.count(&EngineCounters::connect_failures);
      state_.fail_waiting(it->second, XferCause::kInternal, &finished);
    } else {
      conn->peer = peer_id;
      gen = conn->gen;
      it->second.conn_gen = gen;
      address = it->second.address;
      record = proto::encode_rdma_handshake(local_record(state_.device, *conn, state_.context.agent));
    }
  }
  if (gen == 0) {
    State::run_finished(finished);
    return;
  }
  // Network part, without the lock (backend_state.h); blocks this thread for at most
  // connect_timeout_ms.
  const auto deadline =
      ControlClock::now() + std::chrono::milliseconds(state_.options.connect_timeout_ms);
  int fd = -1;
  std::string reply;
  proto::RdmaHandshake remote;
  Status s = control_connect(address, deadline, &fd);
  if (s) s = control_send_record(fd, record, deadline);
  if (s) s = control_recv_record(fd, proto::kRdmaHandshakeMaxBytes, deadline, &reply);
  if (s) {
    s = proto::decode_rdma_handshake(std::as_bytes(std::span(reply)), &remote);
    if (!s) state_.count(&EngineCounters::bad_frames);
  }
  {
    std::lock_guard lock(state_.mu);
    auto conn_it = state_.conns.find(gen);
    auto peer_it = state_.peers.find(peer_id);
    if (conn_it == state_.conns.end() || peer_it == state_.peers.end()) {  // removed meanwhile
      if (fd >= 0) ::close(fd);
      if (conn_it != state_.conns.end()) state_.break_conn(gen, XferCause::kPeerGone, &finished);
    } else {
      Connection& conn = *conn_it->second;
      conn.fd = fd;
      if (s) s = bring_up(state_.device, conn, remote);
      PeerState& peer = peer_it->second;
      if (!s) {
        state_.count(&EngineCounters::connect_failures);
        state_.break_conn(gen, XferCause::kPeerGone, &finished);
        state_.fail_waiting(peer, XferCause::kPeerGone, &finished);
        peer.backoff = std::clamp(peer.backoff * 2, std::chrono::milliseconds(50),
                                  std::chrono::milliseconds(2000));
        peer.retry_after = ControlClock::now() + peer.backoff;
      } else {
        conn.ready = true;
        conn.fd_watched = true;
        state_.watch_adds.emplace_back(fd, gen);
        peer.backoff = std::chrono::milliseconds(0);
        state_.count(&EngineCounters::connects);
        for (std::uint64_t id : peer.waiting) {
          auto t = state_.tasks.find(id);
          if (t == state_.tasks.end()) continue;
          t->second.stage = Stage::kPosting;
          t->second.conn_gen = gen;
          conn.posting.push_back(id);
        }
        peer.waiting.clear();
      }
    }
  }
  state_.wake_control();
  State::run_finished(finished);
}

}  // namespace pdr::transfer::rdma
