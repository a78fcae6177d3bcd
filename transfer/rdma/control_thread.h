// ControlThread: the serving side of the RDMA handshake and the watch on every control socket.
//
// It polls the control listener, State::wake_fd and the watched sockets (poll, 1 s at most, so a
// missed wake-up is not fatal).
// - An accepted connection must send the peer's handshake record within connect_timeout_ms (a
//   record that does not decode counts bad_frames); then, under the lock, a serving Connection with
//   as many QPs as the peer offered (connection.h) is created and brought up, and our record goes
//   back. The socket is watched from then on. The answer is written on this thread, so a slow peer
//   delays other handshakes by at most connect_timeout_ms.
// - A watched socket that reports EOF, an error, or any byte after the handshake (a protocol
//   violation, counted bad_frames) breaks its connection: the QPs were set up over it, and its end
//   is how this side learns that the peer (or its QPs) went away.
// - The connector thread hands over the sockets of the connections it set up through
//   State::watch_adds and wakes this thread with State::wake_control().
//
// Ownership: this thread owns every watched socket and is the only one to close it; other threads
// break a connection by shutting its socket down (State::break_conn), which this thread sees as
// EOF. After join(), close_all() closes what was still watched or handed over.
//
// Threads: started, joined and close_all() by the backend's start() and stop(); the loop ends
// once State::stopping is set and the thread is woken.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "transfer/rdma/backend_state.h"

namespace pdr::transfer::rdma {

class ControlThread final : public BackendThread {
 public:
  using BackendThread::BackendThread;

  // After join(), with the backend lock held: closes every watched and handed-over socket.
  void close_all();

 private:
  void run() override;
  void accept_one();
  // Breaks the connections whose sockets in `closed` ended, and closes those sockets.
  void drop(const std::vector<std::pair<int, std::uint32_t>>& closed);

  std::vector<std::pair<int, std::uint32_t>> watched_;  // (fd, gen), this thread only
};

}  // namespace pdr::transfer::rdma
