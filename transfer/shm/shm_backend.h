// The same-host shared-memory backend (docs/design/kv-transfer.md, S-1..S-5).
//
// How it works:
// - Each backend listens on an abstract UNIX socket ("@pdr-shm-<agent>-<pid>-<rand>", published
//   as its kShm endpoint). can_reach() is true for a peer that publishes a kShm endpoint and has
//   the same non-empty hostname and boot id as we do.
// - add_peer() connects at once (local and cheap) and says HELLO; the peer answers with each of its
//   regions: memfd-backed ones (Engine::allocate_region) come with their fd over SCM_RIGHTS and we
//   mmap them MAP_SHARED, so a transfer is a plain memcpy by the initiator. Regions without an fd
//   are reached by cross-memory attach (process_vm_readv/writev to the pid from SO_PEERCRED) when
//   allow_cma is set on both sides. A failing connect or handshake makes add_peer() fail, so the
//   engine falls back to the next backend (tcp).
// - A region unknown to the mapping (registered after we connected) is asked for once per task;
//   still unknown -> the task fails kAccess. Every span is checked against the mapped length.
// - Copies run on copy worker threads (ShmBackendOptions::copy_threads), segment by segment in
//   order, in 4 MiB chunks; cancel and the task's cancel_cause() are honoured between chunks. A
//   segment >= 8 MiB is split across the workers.
// - After the copies, a task with a notify message sends NOTIFY over the socket; the peer delivers
//   it through on_notification() and acknowledges; the task finishes kDone on that ack, so the
//   notification is ordered after the data (S-4).
// - Peer loss (the socket hangs up, or the peer is removed): in-flight and later tasks to it
//   finish kFailed/kPeerGone. The mappings of its memfds stay alive until no copy uses them. There
//   is no reconnect: a restarted peer has a new socket name, so the engine re-imports it.
//
// Who may connect: the socket is abstract, so any process in the network
// namespace can reach it. Every accepted connection's SO_PEERCRED uid must be in allowed_uids
// (default: our own effective uid) before a single frame is read; any other is closed at once,
// counted in EngineCounters::shm_peers_refused and logged (at most once a second). add_peer()
// applies the same check to the process listening at the peer's address (so we never map fds
// from, nor notify, a squatter of another uid).
//
// Cross-memory attach and Yama (no process-wide PR_SET_PTRACER_ANY any more): with
// kernel.yama.ptrace_scope=1 a process may only be attached by its ancestors or by the one pid it
// names with PR_SET_PTRACER. The kernel keeps a single such pid per process, so CMA is served to
// one peer process at a time (cma_grant.h): the first connection that needs an fd-less region
// announced names its SO_PEERCRED pid; a second peer process is refused CMA while the first is
// connected (its transfers to fd-less regions fail kAccess, memfd regions work for everyone).
// This is the safest choice that keeps fd-less (caller-registered) memory usable: register memory
// with Engine::allocate_region (memfd) for more than one same-host peer, or set allow_cma = false
// to never allow attach at all. Where attach is refused anyway (ptrace_scope 2/3, seccomp),
// such transfers fail kAccess and the reason is logged to stderr once per peer.
//
// Unregistering: a peer that mapped one of our memfds keeps its own mapping
// (the memfd's pages stay alive while mapped and are never reused for other data of ours, so that
// is safe). A peer that reaches a region by address (CMA) has cached it: on_region_unregistered()
// sends it kRegionRevoke and waits (up to 2 s) for kRevokeAck, which the peer sends after dropping
// the region and letting its copies in progress (one 4 MiB chunk each) finish; later transfers to
// it fail kAccess. A peer that does not acknowledge in time is disconnected (and loses the
// ptrace grant); that bound is the one residual window for a peer that is wedged mid-copy.
//
// Threads: one I/O thread (epoll: listener, serving connections, our outgoing connections) and the
// copy workers. Everything in the Backend interface is thread-safe.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transfer/backend.h"

namespace pdr::transfer {

struct ShmBackendOptions {
  // Copy worker threads. 0: automatic, 2 on machines with >= 2 cores (copies >= 8 MiB are split
  // across both), else 1.
  std::uint32_t copy_threads = 0;
  // Serve fd-less regions by address and reach a peer's fd-less regions by cross-memory attach.
  bool allow_cma = true;
  // Local peer uids (SO_PEERCRED) allowed to connect to us and to be connected to. Empty: only our
  // own effective uid.
  std::vector<uid_t> allowed_uids;
  // Abstract socket name (without '@'). Default: "pdr-shm-<agent>-<pid>-<random hex>".
  std::string socket_name;
};

std::unique_ptr<Backend> make_shm_backend(const ShmBackendOptions& options);

}  // namespace pdr::transfer
