#include "node/sim/kv_mover.h"

#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <thread>
#include <mutex>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>

#include "proto/base/log.h"
#include <zmq.hpp>

#include "node/sim/dialect.h"
#include "node/sim/kv_blocks.h"
#include "node/sim/kv_channel.h"
#include "node/sim/kv_content.h"
#include "node/sim/kv_peer.h"
#include "node/sim/kv_task_pool.h"
#include "node/sim/kv_tsan.h"
#include "node/sim/kv_wire.h"
#include "transfer/backend_factory.h"
#include "transfer/engine.h"

namespace pdr::node::sim {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr auto kWaitSlice = std::chrono::milliseconds(100);
constexpr auto kDescribeTimeout = std::chrono::seconds(5);
constexpr auto kReapPeriod = std::chrono::milliseconds(50);

std::string random_suffix() {
  std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

SimError kv_error(int status, const char* reason, std::string message) {
  return SimError{status, reason, std::move(message)};
}

struct PendingWrite {
  transfer::PeerId peer = transfer::kInvalidPeer;
  uint32_t layout = 0;
  std::vector<uint32_t> blocks;
};

// One request's KV on a prefill: its blocks once the leg finished, and/or a decode's write
// request that came first.
struct PrefillEntry {
  std::vector<uint32_t> blocks;
  bool exported = false;
  Clock::time_point expires;
  std::optional<PendingWrite> write;
};

// One decode leg's import. `blocks` are freed when both the import finished and the leg ended.
struct DecodeOp {
  std::mutex mu;
  std::vector<uint32_t> blocks;
  bool finished = false;
  bool ended = false;
  bool write_may_land = false;  // a WRITE was asked for and its notification not seen
};

struct PeerInfo {
  transfer::PeerId peer = transfer::kInvalidPeer;
  uint32_t layout = 0;
};

}  // namespace

struct EngineKvMover::Impl {
  EngineKvMoverOptions o;
  std::unique_ptr<transfer::Engine> engine;
  std::byte* base = nullptr;
  transfer::LayoutId layout = 0;
  std::string descriptor;  // export_local() once the region and layout exist
  std::unique_ptr<KvBlockPool> pool;
  zmq::context_t zmq_context{1};
  std::unique_ptr<KvChannelServer> channel;
  std::unique_ptr<KvTaskPool> tasks;
  std::atomic<bool> stopping{false};
  bool is_stopping() const { return stopping.load(std::memory_order_acquire); }
  const SimDialect* dialect = nullptr;  // the node's (find_sim_dialect)
  bool push = false;                     // dialect->movement == KvMovement::kPush
  // Reaps stale prefill entries and quarantined decode blocks every kReapPeriod until stop().
  std::mutex reaper_mu;
  std::condition_variable reaper_cv;
  std::thread reaper;

  std::atomic<uint64_t> transfers{0}, bytes_moved{0}, mismatches{0}, errors{0}, reaped{0},
      bad_messages{0}, unknown_notifications{0};

  mutable std::mutex mu;  // guards the four tables below
  std::unordered_map<std::string, PrefillEntry> entries;            // prefill, by transfer key
  std::unordered_map<std::string, PeerInfo> peers;                  // decode, by side channel
  std::unordered_map<uint64_t, std::shared_ptr<DecodeOp>> ops;      // decode, by lease
  std::vector<std::pair<Clock::time_point, std::vector<uint32_t>>> quarantine;
  ExportReleased export_released;  // under mu (set_export_released)
  // Tells the server the blocks of `key`'s export are gone (called without mu held).
  void released(const std::string& key) {
    ExportReleased fn;
    {
      std::lock_guard<std::mutex> lock(mu);
      fn = export_released;
    }
    if (fn) fn(key);
  }
  uint64_t next_lease = 1;

  uint64_t request_bytes(size_t blocks) const {
    return uint64_t{blocks} * o.layers * o.block_bytes;
  }
  std::span<std::byte> block(uint32_t id, uint32_t layer) const {
    return {base + (uint64_t{layer} * o.blocks + id) * o.block_bytes, o.block_bytes};
  }

  Status init();
  Status start_side_channel();

  // ---- prefill ----
  std::string on_request(std::string_view bytes);
  void on_notifications();
  void reap();
  void schedule_write(const std::string& key, std::vector<uint32_t> mine, PendingWrite write);
  void do_write(const std::string& key, const std::vector<uint32_t>& mine,
                const PendingWrite& write);

  // ---- decode ----
  void run_import(const KvBlocks& blocks, DecodeOp& op, Clock::time_point deadline,
                  std::optional<SimError>* error);
  std::optional<SimError> import_read(const KvBlocks& blocks, DecodeOp& op,
                                      Clock::time_point deadline);
  std::optional<SimError> import_write(const KvBlocks& blocks, DecodeOp& op,
                                       Clock::time_point deadline);
  std::optional<SimError> allocate_for(const KvBlocks& blocks, DecodeOp& op);
  // The prefill's side channel (*where, *address = where->to_string()) and its engine peer.
  std::optional<SimError> get_peer(const KvBlocks& blocks, Clock::time_point deadline,
                                   PeerInfo* peer, proto::HostPort* where, std::string* address);
  void forget_peer(const std::string& address);
  std::optional<SimError> verify(const KvBlocks& blocks, const std::vector<uint32_t>& ids);
  void free_op(DecodeOp& op);  // op.mu held
  void reap_quarantine();

  // Waits for a submitted transfer (submitted with the engine deadline, which finishes it
  // kTimeout); on stop() cancels it and then waits until the backend has let go of our memory.
  transfer::XferResult wait_transfer(transfer::Completion& done, transfer::XferId id);
};

// ---------------------------------------------------------------------------------------------
// set-up

Status EngineKvMover::Impl::init() {
  dialect = find_sim_dialect(o.node);
  if (dialect == nullptr) {
    return Status(StatusCode::kInvalidValue,
                  "no simulated KV dialect for connector " +
                      std::string(proto::to_string(o.node.connector)) + " mode " +
                      std::string(proto::to_string(o.node.transfer_mode)));
  }
  push = dialect->movement == KvMovement::kPush;
  if (o.block_bytes == 0 || o.blocks == 0 || o.layers == 0) {
    return Status(StatusCode::kInvalidValue, "KV pool: blocks, block bytes and layers must be > 0");
  }
  std::vector<transfer::BackendKind> kinds;
  if (Status s = transfer::parse_backend_list(o.backends, &kinds); !s.is_ok()) return s;
  transfer::BackendSettings settings;
  settings.tcp_listen_host = o.bind_host;
  settings.advertise_host = o.node.advertise_host;
  std::vector<std::unique_ptr<transfer::Backend>> backends;
  if (Status s = transfer::make_backends(kinds, settings, &backends); !s.is_ok()) return s;
  transfer::EngineOptions engine_options;
  engine_options.agent = "sim-" + std::string(proto::to_string(o.node.role)) + "-" +
                         o.node.advertise_host + "-" + std::to_string(::getpid()) + "-" +
                         random_suffix();
  if (Status s = transfer::Engine::create(engine_options, std::move(backends), &engine);
      !s.is_ok()) {
    return s;
  }
  const uint64_t length = uint64_t{o.blocks} * o.layers * o.block_bytes;
  transfer::RegionId region = transfer::kInvalidRegion;
  if (Status s = engine->allocate_region(length, &region, &base); !s.is_ok()) return s;
  transfer::BlockLayout shape;
  shape.region = region;
  shape.block_bytes = o.block_bytes;
  shape.stride = o.block_bytes;
  shape.block_count = o.blocks;
  shape.layers = o.layers;
  shape.layer_stride = uint64_t{o.blocks} * o.block_bytes;
  if (Status s = engine->define_layout(shape, &layout); !s.is_ok()) return s;
  descriptor = engine->export_local();
  pool = std::make_unique<KvBlockPool>(o.blocks);
  tasks = std::make_unique<KvTaskPool>(o.io_threads);
  if (Status s = start_side_channel(); !s.is_ok()) return s;
  reaper = std::thread([this] {
    std::unique_lock<std::mutex> lock(reaper_mu);
    while (!reaper_cv.wait_for(lock, kReapPeriod,
                               [this] { return is_stopping(); })) {
      reap();
      reap_quarantine();
    }
  });
  return Status::ok();
}

Status EngineKvMover::Impl::start_side_channel() {
  channel = std::make_unique<KvChannelServer>(zmq_context);
  KvNodeIdentity& node = o.node;
  auto bind = [&](uint16_t port, uint16_t* bound) { return channel->bind(o.bind_host, port, bound); };
  // Each range: its base (0: an ephemeral one, written back) and the ports after it.
  for (const SidePortRange& range : dialect->side_channel(node)) {
    uint16_t& base_port = node.*range.base;
    if (Status s = bind(base_port, &base_port); !s.is_ok()) return s;
    for (uint32_t i = 1; i < range.count; ++i) {
      uint16_t ignored = 0;
      if (base_port + i > 65535) {
        return Status(StatusCode::kInvalidValue, "KV side channel: ports past 65535");
      }
      if (Status s = bind(static_cast<uint16_t>(base_port + i), &ignored); !s.is_ok()) return s;
    }
  }
  KvChannelHandlers handlers;
  handlers.on_request = [this](std::string_view bytes) { return on_request(bytes); };
  // A decode's notifications are consumed by its WRITE waits (import_write), not here; a READ
  // (pull) decode gets one only when a prefill pulled the blocks it kept for a conversation's
  // next turn (bidirectional NIXL), which frees them as a prefill's are.
  if (o.node.role == proto::Role::kPrefill || !push) {
    handlers.watch_fd = engine->notification_fd();
    handlers.on_watch_fd = [this] { on_notifications(); };
  }
  channel->start(std::move(handlers));
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// prefill

std::string EngineKvMover::Impl::on_request(std::string_view bytes) {
  KvMessage request;
  KvMessage reply;
  if (auto e = decode_kv_message(bytes, &request)) {
    bad_messages.fetch_add(1, std::memory_order_relaxed);
    reply.type = KvMessageType::kError;
    reply.error = "bad message: " + *e;
    return encode_kv_message(reply);
  }
  switch (request.type) {
    case KvMessageType::kDescribe:
      reply.type = KvMessageType::kDescriptor;
      reply.descriptor = descriptor;
      reply.layout = layout;
      reply.block_bytes = o.block_bytes;
      reply.layers = o.layers;
      return encode_kv_message(reply);
    case KvMessageType::kWriteRequest: {
      reply.type = KvMessageType::kError;
      if (o.node.role != proto::Role::kPrefill) {
        reply.error = "this node is a decode: it takes no write requests";
        bad_messages.fetch_add(1, std::memory_order_relaxed);
        return encode_kv_message(reply);
      }
      if (request.block_bytes != o.block_bytes || request.layers != o.layers) {
        reply.error = "KV shape differs: the decode has " + std::to_string(request.block_bytes) +
                      " bytes x " + std::to_string(request.layers) + " layers, this prefill " +
                      std::to_string(o.block_bytes) + " x " + std::to_string(o.layers);
        errors.fetch_add(1, std::memory_order_relaxed);
        return encode_kv_message(reply);
      }
      PendingWrite write;
      write.layout = request.layout;
      write.blocks = std::move(request.blocks);
      if (Status s = engine->import_peer(std::string_view(request.descriptor), &write.peer);
          !s.is_ok()) {
        bad_messages.fetch_add(1, std::memory_order_relaxed);
        reply.error = "bad descriptor: " + s.to_string();
        return encode_kv_message(reply);
      }
      std::vector<uint32_t> mine;
      bool ready = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        PrefillEntry& entry = entries[request.key];
        if (entry.exported) {
          mine = std::move(entry.blocks);
          entries.erase(request.key);
          ready = true;
        } else {
          entry.write = write;
          entry.expires = Clock::now() + o.hold;
        }
      }
      if (ready) schedule_write(request.key, std::move(mine), std::move(write));
      reply.type = KvMessageType::kAck;
      return encode_kv_message(reply);
    }
    default:
      bad_messages.fetch_add(1, std::memory_order_relaxed);
      reply.type = KvMessageType::kError;
      reply.error = "unexpected message type " + std::to_string(static_cast<int>(request.type));
      return encode_kv_message(reply);
  }
}

// READ dialects: the decode's notification says it has the blocks.
void EngineKvMover::Impl::on_notifications() {
  std::vector<transfer::Notification> notes;
  engine->take_notifications(&notes);
  for (const transfer::Notification& note : notes) {
    std::vector<uint32_t> blocks;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = entries.find(note.message);
      if (it == entries.end() || !it->second.exported) {
        unknown_notifications.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      blocks = std::move(it->second.blocks);
      entries.erase(it);
    }
    // Counted before the blocks go back, so "nothing held" implies "counted".
    transfers.fetch_add(1, std::memory_order_relaxed);
    bytes_moved.fetch_add(request_bytes(blocks.size()), std::memory_order_relaxed);
    pool->release(blocks);
    released(note.message);
  }
}

void EngineKvMover::Impl::reap() {
  const Clock::time_point now = Clock::now();
  std::vector<uint32_t> freed;
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = entries.begin(); it != entries.end();) {
      if (it->second.expires > now) {
        ++it;
        continue;
      }
      if (it->second.exported) {
        pdr::log::warn("sim KV: reaping {} blocks of '{}' nobody pulled", it->second.blocks.size(),
                     it->first);
        keys.push_back(it->first);
      } else {
        pdr::log::warn("sim KV: dropping the write request for '{}': no prefill leg exported it",
                     it->first);
      }
      freed.insert(freed.end(), it->second.blocks.begin(), it->second.blocks.end());
      it = entries.erase(it);
    }
  }
  if (!freed.empty()) {
    // Counted before they are freed: whoever sees kv_blocks_held drop also sees them reaped.
    reaped.fetch_add(freed.size(), std::memory_order_relaxed);
    pool->release(freed);
  }
  for (const std::string& key : keys) released(key);
}

void EngineKvMover::Impl::schedule_write(const std::string& key, std::vector<uint32_t> mine,
                                         PendingWrite write) {
  auto task = [this, key, mine = std::move(mine), write = std::move(write)] {
    do_write(key, mine, write);
  };
  if (!tasks->post(task)) task();  // stopping: fail it right here
}

void EngineKvMover::Impl::do_write(const std::string& key, const std::vector<uint32_t>& mine,
                                   const PendingWrite& write) {
  // Equal when both legs saw the same prompt; otherwise the decode finds the gap and says so.
  const size_t count = std::min(mine.size(), write.blocks.size());
  const Clock::time_point deadline = Clock::now() + o.transfer_timeout;
  transfer::BlockXfer xfer;
  xfer.op = transfer::XferOp::kWrite;
  xfer.peer = write.peer;
  xfer.local_layout = layout;
  xfer.local_blocks = std::span<const uint32_t>(mine.data(), count);
  xfer.remote_layout = write.layout;
  xfer.remote_blocks = std::span<const uint32_t>(write.blocks.data(), count);
  xfer.notify = key;
  xfer.deadline = deadline;
  transfer::Completion done;
  transfer::XferId id = 0;
  bool ok = false;
  if (is_stopping()) {
    pdr::log::warn("sim KV: stopping, not writing '{}'", key);
  } else if (Status s = engine->submit(xfer, &done, &id); !s.is_ok()) {
    pdr::log::warn("sim KV: cannot write '{}': {}", key, s.to_string());
  } else {
    const transfer::XferResult r = wait_transfer(done, id);
    ok = r.state == transfer::XferState::kDone;
    if (!ok) {
      pdr::log::warn("sim KV: writing '{}' {}: {}", key, transfer::xfer_state_label(r.state),
                   transfer::xfer_cause_label(r.cause));
    }
  }
  // Counted before the blocks go back, so "nothing held" implies "counted".
  if (ok) {
    transfers.fetch_add(1, std::memory_order_relaxed);
    bytes_moved.fetch_add(request_bytes(count), std::memory_order_relaxed);
  } else {
    errors.fetch_add(1, std::memory_order_relaxed);
  }
  pool->release(mine);
  released(key);
}

transfer::XferResult EngineKvMover::Impl::wait_transfer(transfer::Completion& done,
                                                        transfer::XferId id) {
  while (true) {
    transfer::XferResult r = done.wait_for(kWaitSlice);
    if (r.state != transfer::XferState::kPending) return r;
    if (is_stopping()) break;
  }
  (void)engine->cancel(id);  // kNotFound: it finished meanwhile, which the wait below sees
  // The engine finishes a cancelled transfer promptly; until then our memory is still in use.
  while (true) {
    transfer::XferResult r = done.wait_for(std::chrono::seconds(1));
    if (r.state != transfer::XferState::kPending) return r;
    pdr::log::warn("sim KV: waiting for a cancelled transfer to let go of its blocks");
  }
}

// ---------------------------------------------------------------------------------------------
// decode

std::optional<SimError> EngineKvMover::Impl::allocate_for(const KvBlocks& blocks, DecodeOp& op) {
  const uint32_t count = kv_block_count(blocks.prompt_tokens);
  std::vector<uint32_t> ids;
  if (!pool->allocate(count, &ids)) {
    return kv_error(503, "kv_pool_full",
                    "no room for " + std::to_string(count) + " KV blocks (" +
                        std::to_string(pool->held()) + " of " + std::to_string(o.blocks) +
                        " held)");
  }
  std::lock_guard<std::mutex> lock(op.mu);
  op.blocks = std::move(ids);
  return std::nullopt;
}

std::optional<SimError> EngineKvMover::Impl::get_peer(const KvBlocks& blocks,
                                                      Clock::time_point deadline, PeerInfo* peer,
                                                      proto::HostPort* where,
                                                      std::string* address) {
  if (auto e = resolve_kv_peer(*dialect, blocks, deadline, where)) return e;
  *address = where->to_string();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = peers.find(*address); it != peers.end()) {
      *peer = it->second;
      return std::nullopt;
    }
  }
  KvMessage describe;
  describe.type = KvMessageType::kDescribe;
  std::string raw;
  const Clock::time_point describe_deadline = std::min(deadline, Clock::now() + kDescribeTimeout);
  if (auto e = kv_channel_call(zmq_context, where->host, where->port, encode_kv_message(describe),
                               describe_deadline, &raw, [this] { return is_stopping(); })) {
    return kv_error(502, "kv_peer_unreachable", "prefill KV side channel: " + *e);
  }
  KvMessage reply;
  if (auto e = decode_kv_message(raw, &reply)) {
    bad_messages.fetch_add(1, std::memory_order_relaxed);
    return kv_error(502, "kv_peer_unreachable", "prefill " + *address + " answered badly: " + *e);
  }
  if (reply.type != KvMessageType::kDescriptor) {
    return kv_error(502, "kv_peer_unreachable",
                    "prefill " + *address + " refused the descriptor request: " + reply.error);
  }
  if (reply.block_bytes != o.block_bytes || reply.layers != o.layers) {
    return kv_error(502, "kv_transfer_failed",
                    "prefill " + *address + " has KV blocks of " +
                        std::to_string(reply.block_bytes) + " bytes x " +
                        std::to_string(reply.layers) + " layers, this decode " +
                        std::to_string(o.block_bytes) + " x " + std::to_string(o.layers));
  }
  PeerInfo info;
  info.layout = reply.layout;
  if (Status s = engine->import_peer(std::string_view(reply.descriptor), &info.peer); !s.is_ok()) {
    return kv_error(502, "kv_transfer_failed",
                    "prefill " + *address + " descriptor refused: " + s.to_string());
  }
  std::lock_guard<std::mutex> lock(mu);
  peers[*address] = info;
  *peer = info;
  return std::nullopt;
}

void EngineKvMover::Impl::forget_peer(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu);
  peers.erase(address);
}

std::optional<SimError> EngineKvMover::Impl::verify(const KvBlocks& blocks,
                                                    const std::vector<uint32_t>& ids) {
  const std::string& key = kv_transfer_key(blocks);
  const uint64_t seed = kv_content_seed(key, blocks.prompt);
  IgnoreKvPayloadAccesses payload;
  for (uint32_t i = 0; i < ids.size(); ++i) {
    for (uint32_t layer = 0; layer < o.layers; ++layer) {
      if (auto at = check_kv_block(seed, i, layer, block(ids[i], layer))) {
        mismatches.fetch_add(1, std::memory_order_relaxed);
        return kv_error(500, "kv_mismatch",
                        "KV mismatch for '" + key + "': block " + std::to_string(i) +
                            " (local block id " + std::to_string(ids[i]) + ") layer " +
                            std::to_string(layer) + " differs at byte " + std::to_string(*at));
      }
    }
  }
  return std::nullopt;
}

std::optional<SimError> EngineKvMover::Impl::import_read(const KvBlocks& blocks, DecodeOp& op,
                                                         Clock::time_point deadline) {
  const uint32_t count = kv_block_count(blocks.prompt_tokens);
  if (blocks.block_ids.size() != count) {
    mismatches.fetch_add(1, std::memory_order_relaxed);
    return kv_error(500, "kv_mismatch",
                    "remote_block_ids names " + std::to_string(blocks.block_ids.size()) +
                        " blocks but the prompt (" + std::to_string(blocks.prompt_tokens) +
                        " tokens) needs " + std::to_string(count));
  }
  std::vector<uint32_t> remote;
  for (int64_t id : blocks.block_ids) {
    if (id < 0 || id > UINT32_MAX) {
      return kv_error(400, "bad_remote_block_ids", "remote block id " + std::to_string(id) +
                                                       " is not a block id");
    }
    remote.push_back(static_cast<uint32_t>(id));
  }
  if (auto e = allocate_for(blocks, op)) return e;
  PeerInfo peer;
  proto::HostPort where;
  std::string address;
  if (auto e = get_peer(blocks, deadline, &peer, &where, &address)) return e;
  std::vector<uint32_t> local;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    local = op.blocks;
  }
  transfer::BlockXfer xfer;
  xfer.op = transfer::XferOp::kRead;
  xfer.peer = peer.peer;
  xfer.local_layout = layout;
  xfer.local_blocks = local;
  xfer.remote_layout = peer.layout;
  xfer.remote_blocks = remote;
  xfer.notify = kv_transfer_key(blocks);  // the prefill frees its blocks on it
  xfer.deadline = deadline;
  transfer::Completion done;
  transfer::XferId id = 0;
  if (Status s = engine->submit(xfer, &done, &id); !s.is_ok()) {
    return kv_error(502, "kv_transfer_failed",
                    "cannot READ from prefill " + address + ": " + s.to_string());
  }
  const transfer::XferResult r = wait_transfer(done, id);
  if (r.state != transfer::XferState::kDone) {
    if (r.cause == transfer::XferCause::kPeerGone) forget_peer(address);
    if (r.cause == transfer::XferCause::kTimeout || Clock::now() >= deadline) {
      return kv_error(504, "kv_timeout", "READ from prefill " + address + " timed out");
    }
    return kv_error(502, "kv_transfer_failed",
                    "READ from prefill " + address + " " +
                        std::string(transfer::xfer_state_label(r.state)) + ": " +
                        std::string(transfer::xfer_cause_label(r.cause)));
  }
  return verify(blocks, local);
}

std::optional<SimError> EngineKvMover::Impl::import_write(const KvBlocks& blocks, DecodeOp& op,
                                                          Clock::time_point deadline) {
  if (auto e = allocate_for(blocks, op)) return e;
  PeerInfo peer;
  proto::HostPort where;
  std::string address;
  if (auto e = get_peer(blocks, deadline, &peer, &where, &address)) return e;
  const std::string& key = kv_transfer_key(blocks);
  KvMessage request;
  request.type = KvMessageType::kWriteRequest;
  request.key = key;
  request.descriptor = descriptor;
  request.layout = layout;
  request.block_bytes = o.block_bytes;
  request.layers = o.layers;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    request.blocks = op.blocks;
    op.write_may_land = true;  // from here on the prefill may write into them
  }
  std::string raw;
  // A prefill that died (or was stopped) before answering would hold this decode, and its node's
  // shutdown, until the KV deadline: the call gives up as soon as the leg ends or the node stops.
  const auto ended = [&op] {
    std::lock_guard<std::mutex> lock(op.mu);
    return op.ended;
  };
  if (auto e = kv_channel_call(zmq_context, where.host, where.port, encode_kv_message(request),
                               deadline, &raw, [&] { return is_stopping() || ended(); })) {
    if (ended()) return kv_error(499, "kv_abandoned", "the decode leg ended before its KV came");
    if (is_stopping()) return kv_error(503, "kv_stopping", "the node is stopping");
    forget_peer(address);
    return kv_error(502, "kv_peer_unreachable", "prefill KV side channel: " + *e);
  }
  KvMessage reply;
  if (auto e = decode_kv_message(raw, &reply)) {
    bad_messages.fetch_add(1, std::memory_order_relaxed);
    return kv_error(502, "kv_transfer_failed", "prefill " + address + " answered badly: " + *e);
  }
  if (reply.type != KvMessageType::kAck) {
    return kv_error(502, "kv_transfer_failed",
                    "prefill " + address + " refused the write request: " + reply.error);
  }
  while (true) {
    const Clock::time_point slice = std::min(deadline, Clock::now() + kWaitSlice);
    if (engine->wait_notification(key, slice)) break;
    if (ended()) return kv_error(499, "kv_abandoned", "the decode leg ended before its KV came");
    if (is_stopping()) return kv_error(503, "kv_stopping", "the node is stopping");
    if (Clock::now() >= deadline) {
      return kv_error(504, "kv_timeout",
                      "no KV written by prefill " + address + " for '" + key + "' within " +
                          std::to_string(o.transfer_timeout.count()) + " ms");
    }
  }
  std::vector<uint32_t> local;
  {
    std::lock_guard<std::mutex> lock(op.mu);
    op.write_may_land = false;  // the notification follows the last byte
    local = op.blocks;
  }
  return verify(blocks, local);
}

void EngineKvMover::Impl::run_import(const KvBlocks& blocks, DecodeOp& op,
                                     Clock::time_point deadline, std::optional<SimError>* error) {
  *error = push ? import_write(blocks, op, deadline) : import_read(blocks, op, deadline);
  if (*error) {
    errors.fetch_add((*error)->reason == "kv_mismatch" ? 0 : 1, std::memory_order_relaxed);
    pdr::log::warn("sim KV: decode import for '{}' failed: {}", kv_transfer_key(blocks),
                 (*error)->message);
  } else {
    transfers.fetch_add(1, std::memory_order_relaxed);
    bytes_moved.fetch_add(request_bytes(kv_block_count(blocks.prompt_tokens)),
                          std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(op.mu);
  op.finished = true;
  if (op.ended) free_op(op);
}

void EngineKvMover::Impl::free_op(DecodeOp& op) {
  if (op.blocks.empty()) return;
  if (op.write_may_land) {
    std::lock_guard<std::mutex> lock(mu);
    quarantine.emplace_back(Clock::now() + o.hold, std::move(op.blocks));
  } else {
    pool->release(op.blocks);
  }
  op.blocks.clear();
}

void EngineKvMover::Impl::reap_quarantine() {
  const Clock::time_point now = Clock::now();
  std::vector<uint32_t> freed;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = quarantine.begin(); it != quarantine.end();) {
      if (it->first > now) {
        ++it;
        continue;
      }
      freed.insert(freed.end(), it->second.begin(), it->second.end());
      it = quarantine.erase(it);
    }
  }
  if (!freed.empty()) {
    reaped.fetch_add(freed.size(), std::memory_order_relaxed);  // before release, as in reap()
    pool->release(freed);
  }
}

// ---------------------------------------------------------------------------------------------
// EngineKvMover

EngineKvMover::EngineKvMover(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

EngineKvMover::~EngineKvMover() { stop(); }

Status EngineKvMover::create(EngineKvMoverOptions options, std::unique_ptr<EngineKvMover>* out) {
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  if (Status s = impl->init(); !s.is_ok()) {
    if (impl->channel) impl->channel->stop();
    if (impl->tasks) impl->tasks->stop();
    return s;  // the reaper starts last, so it is not running here
  }
  out->reset(new EngineKvMover(std::move(impl)));
  return Status::ok();
}

const KvNodeIdentity& EngineKvMover::node() const { return impl_->o.node; }

std::string EngineKvMover::engine_agent() const { return impl_->engine->agent(); }

std::optional<SimError> EngineKvMover::export_prefill_blocks(const KvBlocks& blocks,
                                                             std::vector<int64_t>* block_ids) {
  Impl& m = *impl_;
  const std::string& key = kv_transfer_key(blocks);
  const uint32_t count = kv_block_count(blocks.prompt_tokens);
  std::vector<uint32_t> ids;
  if (!m.pool->allocate(count, &ids)) {
    m.errors.fetch_add(1, std::memory_order_relaxed);
    return kv_error(503, "kv_pool_full",
                    "no room for " + std::to_string(count) + " KV blocks (" +
                        std::to_string(m.pool->held()) + " of " + std::to_string(m.o.blocks) +
                        " held)");
  }
  const uint64_t seed = kv_content_seed(key, blocks.prompt);
  {
    IgnoreKvPayloadAccesses payload;
    for (uint32_t i = 0; i < count; ++i) {
      for (uint32_t layer = 0; layer < m.o.layers; ++layer) {
        fill_kv_block(seed, i, layer, m.block(ids[i], layer));
      }
    }
  }
  for (uint32_t id : ids) block_ids->push_back(id);
  std::vector<uint32_t> replaced;
  std::optional<PendingWrite> write;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    PrefillEntry& entry = m.entries[key];
    if (entry.exported) replaced = std::move(entry.blocks);  // the same key again: keep the new
    if (entry.write) {
      write = std::move(entry.write);
      m.entries.erase(key);
    } else {
      entry.blocks = ids;
      entry.exported = true;
      entry.expires = Clock::now() + m.o.hold;
    }
  }
  if (!replaced.empty()) m.pool->release(replaced);
  if (write) m.schedule_write(key, std::move(ids), std::move(*write));
  return std::nullopt;
}

uint64_t EngineKvMover::import_decode_blocks(const KvBlocks& blocks, ImportDone done) {
  Impl& m = *impl_;
  auto op = std::make_shared<DecodeOp>();
  uint64_t lease = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    lease = m.next_lease++;
    m.ops[lease] = op;
  }
  const Clock::time_point deadline = Clock::now() + m.o.transfer_timeout;
  auto task = [&m, blocks, op, done = std::move(done), deadline] {
    std::optional<SimError> error;
    m.run_import(blocks, *op, deadline, &error);
    done(std::move(error));
  };
  if (m.stopping.load(std::memory_order_acquire) || !m.tasks->post(task)) {
    done(kv_error(503, "kv_stopping", "the node is stopping"));
  }
  return lease;
}

void EngineKvMover::set_export_released(ExportReleased fn) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->export_released = std::move(fn);
}

void EngineKvMover::end_decode(uint64_t lease) {
  Impl& m = *impl_;
  std::shared_ptr<DecodeOp> op;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.ops.find(lease);
    if (it == m.ops.end()) return;
    op = std::move(it->second);
    m.ops.erase(it);
  }
  std::lock_guard<std::mutex> lock(op->mu);
  op->ended = true;
  if (op->finished) m.free_op(*op);
}

json EngineKvMover::stats() const {
  const Impl& m = *impl_;
  size_t pending = 0;
  size_t quarantined = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    pending = m.entries.size();
    for (const auto& q : m.quarantine) quarantined += q.second.size();
  }
  const transfer::EngineCounters& c = m.engine->counters();
  auto load = [](const std::atomic<uint64_t>& v) { return v.load(std::memory_order_relaxed); };
  // Each range's first port by name; a single range (a port range) also says how many.
  json ports = json::object();
  const std::vector<SidePortRange> ranges = m.dialect->side_channel(m.o.node);
  for (const SidePortRange& range : ranges) ports[range.name] = m.o.node.*range.base;
  if (ranges.size() == 1) ports["count"] = ranges.front().count;
  return json{
      {"kv_backends", m.o.backends},
      {"mode", m.push ? "write" : "read"},
      {"kv_blocks_capacity", m.o.blocks},
      {"kv_block_bytes", m.o.block_bytes},
      {"kv_layers", m.o.layers},
      {"kv_blocks_held", m.pool->held()},
      {"kv_blocks_quarantined", quarantined},
      {"kv_blocks_reaped", load(m.reaped)},
      {"kv_pending_requests", pending},
      {"kv_transfers", load(m.transfers)},
      {"kv_bytes_moved", load(m.bytes_moved)},
      {"kv_mismatches", load(m.mismatches)},
      {"kv_errors", load(m.errors)},
      {"kv_bad_messages", load(m.bad_messages) + (m.channel ? m.channel->bad_envelopes() : 0)},
      {"kv_unknown_notifications", load(m.unknown_notifications)},
      {"side_channel", ports},
      {"engine",
       {{"agent", m.engine->agent()},
        {"backends", m.engine->started_backends()},
        {"in_flight", m.engine->in_flight()},
        {"xfers_submitted", load(c.xfers_submitted)},
        {"xfers_done", load(c.xfers_done)},
        {"xfers_failed", load(c.xfers_failed)},
        {"xfers_cancelled", load(c.xfers_cancelled)},
        {"bytes_written", load(c.bytes_written)},
        {"bytes_read", load(c.bytes_read)},
        {"bytes_served", load(c.bytes_served)},
        {"bad_frames", load(c.bad_frames)},
        {"access_refused", load(c.access_refused)},
        {"auth_failures", load(c.auth_failures)},
        {"hello_timeouts", load(c.hello_timeouts)},
        {"connections_refused", load(c.connections_refused)},
        {"connects", load(c.connects)},
        {"connect_failures", load(c.connect_failures)},
        {"disconnects", load(c.disconnects)},
        {"notifications_sent", load(c.notifications_sent)},
        {"notifications_received", load(c.notifications_received)},
        {"shm_peers_refused", load(c.shm_peers_refused)}}}};
}

void EngineKvMover::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.reaper_mu);
    if (m.stopping.exchange(true)) return;
  }
  m.reaper_cv.notify_all();
  if (m.reaper.joinable()) m.reaper.join();
  if (m.channel) m.channel->stop();
  m.tasks->stop();  // runs what is queued; every wait sees `stopping` within kWaitSlice
}

}  // namespace pdr::node::sim
