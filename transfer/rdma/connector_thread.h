// ConnectorThread: the initiator side of the RDMA handshake, on a thread of its own so that
// submit() and the I/O thread never wait on the network (cancels of tasks queued behind a slow
// connect stay prompt).
//
// It connects peers that have waiting tasks and no connection, one at a time, whenever submit()
// signals State::connect_cv (and every 10 ms, for backoffs that ran out). For one peer: under the
// lock, a Connection with qps_per_peer QPs (connection.h) and our handshake record; without the
// lock, the control socket's connect, our record out and the peer's record in (control_socket.h),
// bounded by connect_timeout_ms; under the lock again, the QPs brought up, the waiting tasks moved
// to the connection's posting queue and the socket handed to the control thread
// (State::watch_adds), which watches it for EOF from then on.
//
// A failed attempt counts connect_failures, fails the waiting tasks kPeerGone (kInternal when the
// CQ cannot take more QPs) and backs the peer off, 50 ms doubling to 2 s, reset by a success. A
// peer removed during the attempt is dropped without touching its state.
//
// Threads: started and joined by the backend's start() and stop(); the loop ends once
// State::stopping is set and connect_cv is notified.
#pragma once


#include "transfer/rdma/backend_state.h"

namespace pdr::transfer::rdma {

class ConnectorThread final : public BackendThread {
 public:
  using BackendThread::BackendThread;

 private:
  void run() override;
  void connect_peer(PeerId peer);
};

}  // namespace pdr::transfer::rdma
