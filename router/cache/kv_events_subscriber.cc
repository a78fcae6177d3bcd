#include "router/cache/kv_events_subscriber.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <span>
#include <thread>
#include "base/log.h"
#include <zmq.hpp>

namespace pdr::router::cache {

namespace {

using Clock = std::chrono::steady_clock;

// Frames beyond a payload's limit: topic and seq are small, this leaves room for a long topic.
constexpr int64_t kFrameSlack = 4096;
constexpr uint64_t kMaxReplayMessages = 1'000'000;  // vLLM's buffer_steps default is 10000

std::span<const std::byte> bytes_of(const zmq::message_t& m) {
  return {static_cast<const std::byte*>(m.data()), m.size()};
}

// What the registry says about one node's publisher.
struct Wanted {
  proto::HostPort endpoint;
  std::optional<proto::HostPort> replay;
  std::vector<uint16_t> ports, replay_ports;  // each rank's, when the node listed them
  uint32_t dp_size = 1;
  uint64_t epoch = 0;
  uint64_t restarts = 0;
};

std::optional<Wanted> wanted_for(const discovery::Instance& inst,
                                 const KvEventsSubscriberOptions& options) {
  if (inst.state == discovery::InstanceState::kExpired) return std::nullopt;
  Wanted w;
  if (inst.kv_events_endpoint) {
    w.endpoint = *inst.kv_events_endpoint;
  } else if (options.default_port) {
    w.endpoint = proto::HostPort{inst.http_address.host, *options.default_port};
  } else {
    return std::nullopt;
  }
  w.replay = inst.kv_events_replay_endpoint;
  if (inst.kv_events_endpoint) w.ports = inst.kv_events_ports;
  w.replay_ports = inst.kv_events_replay_ports;
  w.dp_size = std::max<uint32_t>(1, inst.dp_size);
  w.epoch = inst.epoch;
  w.restarts = inst.restarts;
  return w;
}

}  // namespace

class KvEventsSubscriber::Impl {
 public:
  Impl(const SnapshotCell<discovery::RegistrySnapshot>& registry, BlockIndex& index)
      : registry_(registry), index_(index) {}

  ~Impl() { stop(); }

  Status start(const KvEventsSubscriberOptions& options) {
    options_ = options;
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status(StatusCode::kInternal, "kv_events: eventfd failed");
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  void stop() {
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    thread_.join();
    ::close(wake_fd_);
    wake_fd_ = -1;
  }

  std::vector<KvEventsNodeStats> node_stats() const {
    std::vector<KvEventsNodeStats> out;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      out.reserve(stats_.size());
      for (const auto& [key, s] : stats_) out.push_back(s);
    }
    for (KvEventsNodeStats& s : out) s.blocks_indexed = index_.node_stats(s.node).entries;
    return out;
  }

  KvEventsNodeStats totals() const {
    KvEventsNodeStats t;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      t = totals_;
      for (const auto& [key, s] : stats_) {
        t.subscribed_ranks += s.subscribed_ranks;
        t.ranks_seen += s.ranks_seen;
      }
    }
    t.blocks_indexed = index_.stats().entries;
    return t;
  }

 private:
  // A replay in flight: batches [expected, until) asked of the rank's replay socket. The live
  // batch that revealed the gap (seq `until`) waits here and is applied once the replay ends;
  // meanwhile the rank's SUB socket is not read (its messages wait there, bounded by rcvhwm), so
  // batches are applied in order, and every other rank and node goes on being served.
  struct Replay {
    zmq::socket_t dealer;
    uint64_t from = 0, expected = 0, until = 0;
    uint64_t received = 0;
    Clock::time_point deadline;
    std::vector<std::byte> held;  // the live batch at seq `until`
  };
  struct Rank {
    uint32_t rank = 0;
    zmq::socket_t socket;
    std::string replay_endpoint;  // "" = none
    std::optional<uint64_t> last_seq;
    std::unique_ptr<Replay> replay;  // set while a replay is in flight
  };
  // Where a poll item points: a rank's SUB socket, or its replay DEALER.
  struct Owner {
    std::string node;
    size_t rank;
    bool replay;
  };
  struct Node {
    Wanted wanted;
    std::vector<Rank> ranks;
  };

  // Applies `fn` to the node's counters and to the totals (same field).
  template <typename Fn>
  void count(const std::string& key, Fn&& fn) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    auto it = stats_.find(key);
    if (it != stats_.end()) fn(it->second);
    fn(totals_);
  }

  void run() {
    context_ = std::make_unique<zmq::context_t>(1);
    SnapshotReader<discovery::RegistrySnapshot> reader(registry_);
    // Held, not just its address: a freed snapshot's address may come back for a new one.
    std::shared_ptr<const discovery::RegistrySnapshot> seen;
    auto next_registry_check = Clock::now();
    std::vector<zmq::pollitem_t> items;
    std::vector<Owner> owners;  // poll item i+1 -> its socket's owner
    rebuild_ = true;
    while (true) {
      const auto now = Clock::now();
      if (now >= next_registry_check) {
        const auto& snapshot = reader.get();
        if (snapshot && snapshot != seen) {
          seen = snapshot;
          sync(*snapshot);
          rebuild_ = true;
        }
        next_registry_check = now + options_.registry_poll;
      }
      expire_replays();
      if (rebuild_) {
        items.clear();
        owners.clear();
        replaying_ = false;
        items.push_back(zmq::pollitem_t{nullptr, wake_fd_, ZMQ_POLLIN, 0});
        for (auto& [key, node] : nodes_) {
          for (size_t r = 0; r < node.ranks.size(); ++r) {
            Rank& rank = node.ranks[r];
            // A replaying rank's SUB socket is left alone until its replay ends (Replay above).
            zmq::socket_t& socket = rank.replay ? rank.replay->dealer : rank.socket;
            items.push_back(zmq::pollitem_t{socket.handle(), 0, ZMQ_POLLIN, 0});
            owners.push_back(Owner{key, r, rank.replay != nullptr});
            replaying_ = replaying_ || rank.replay != nullptr;
          }
        }
        rebuild_ = false;
      }
      auto wake_at = next_registry_check;
      if (replaying_) {
        for (auto& [key, node] : nodes_) {
          for (const Rank& rank : node.ranks) {
            if (rank.replay) wake_at = std::min(wake_at, rank.replay->deadline);
          }
        }
      }
      const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
          wake_at - Clock::now() + std::chrono::microseconds(999));  // not a spin just before it
      try {
        zmq::poll(items.data(), items.size(), std::max(timeout, std::chrono::milliseconds(0)));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        pdr::log::error("kv_events: poll failed: {}", e.what());
        break;
      }
      if (items[0].revents & ZMQ_POLLIN) break;  // stop()
      for (size_t i = 1; i < items.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        const Owner& owner = owners[i - 1];
        auto it = nodes_.find(owner.node);
        if (it == nodes_.end()) continue;
        Rank& rank = it->second.ranks[owner.rank];
        if (owner.replay != (rank.replay != nullptr)) continue;  // changed since the poll began
        if (owner.replay) {
          read_replay(it->first, rank);
        } else {
          drain(it->first, rank);
        }
      }
    }
    nodes_.clear();  // sockets close before the context
    context_.reset();
  }

  // Brings nodes_ in line with the registry.
  void sync(const discovery::RegistrySnapshot& snapshot) {
    std::map<std::string, Wanted> wanted;
    for (const auto& inst : snapshot.instances) {
      if (auto w = wanted_for(*inst, options_)) wanted.emplace(inst->key, std::move(*w));
    }
    for (auto it = nodes_.begin(); it != nodes_.end();) {
      if (wanted.count(it->first) == 0) {
        pdr::log::info("kv_events: {} unsubscribed (gone, expired or without an endpoint)", it->first);
        index_.drop_node(it->first);
        {
          std::lock_guard<std::mutex> lock(stats_mu_);
          stats_.erase(it->first);
        }
        it = nodes_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& [key, w] : wanted) {
      auto it = nodes_.find(key);
      if (it != nodes_.end()) {
        Wanted& had = it->second.wanted;
        const bool same_place =
            had.endpoint == w.endpoint && had.replay == w.replay && had.dp_size == w.dp_size &&
            had.ports == w.ports && had.replay_ports == w.replay_ports;
        if (same_place && had.epoch == w.epoch && had.restarts == w.restarts) continue;
        index_.drop_node(key);
        if (same_place) {
          // A restart: the node's cache is empty and its publishers count from 0 again.
          pdr::log::info("kv_events: {} restarted: its entries dropped", key);
          had = w;
          for (Rank& r : it->second.ranks) {
            r.last_seq.reset();
            r.replay.reset();  // its batches belong to the old run
          }
          rebuild_ = true;
          count(key, [](KvEventsNodeStats& s) { ++s.node_restarts; });
          reset_ranks_seen(key);
          continue;
        }
        nodes_.erase(it);
      }
      subscribe(key, w);
    }
  }

  void reset_ranks_seen(const std::string& key) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    auto it = stats_.find(key);
    if (it != stats_.end()) it->second.ranks_seen = 0;
  }

  void subscribe(const std::string& key, const Wanted& w) {
    Node node;
    node.wanted = w;
    for (uint32_t rank = 0; rank < w.dp_size; ++rank) {
      const std::string endpoint = proto::zmq_tcp_rank_endpoint(w.endpoint, w.ports, rank);
      if (endpoint.empty()) {
        pdr::log::warn("kv_events: {} DP rank {}: port {} + {} passes 65535, not subscribed", key,
                     rank, w.endpoint.port, rank);
        break;
      }
      Rank r;
      r.rank = rank;
      if (w.replay) r.replay_endpoint = proto::zmq_tcp_rank_endpoint(*w.replay, w.replay_ports, rank);
      try {
        r.socket = zmq::socket_t(*context_, zmq::socket_type::sub);
        r.socket.set(zmq::sockopt::linger, 0);
        r.socket.set(zmq::sockopt::ipv6, 1);  // else libzmq refuses tcp://[v6]:port
        r.socket.set(zmq::sockopt::maxmsgsize,
                     static_cast<int64_t>(options_.limits.max_payload_bytes) + kFrameSlack);
        r.socket.set(zmq::sockopt::rcvhwm, options_.rcvhwm);
        r.socket.set(zmq::sockopt::subscribe, options_.topic);
        r.socket.connect(endpoint);
      } catch (const zmq::error_t& e) {
        // DNS names are resolved by libzmq at connect; a name it refuses outright lands here.
        pdr::log::warn("kv_events: {} DP rank {}: cannot connect to {}: {}", key, rank, endpoint,
                     e.what());
        continue;
      }
      node.ranks.push_back(std::move(r));
    }
    KvEventsNodeStats s;
    s.node = key;
    s.endpoint = proto::zmq_tcp_endpoint(w.endpoint);
    if (w.replay) s.replay_endpoint = proto::zmq_tcp_endpoint(*w.replay);
    s.subscribed_ranks = static_cast<uint32_t>(node.ranks.size());
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_[key] = s;
    }
    pdr::log::info("kv_events: {} subscribed to {} ({} DP rank(s)){}", key, s.endpoint,
                 s.subscribed_ranks, s.replay_endpoint.empty() ? "" : ", replay " + s.replay_endpoint);
    nodes_[key] = std::move(node);
  }

  // Reads up to max_messages_per_wake messages of one rank's socket.
  void drain(const std::string& key, Rank& rank) {
    std::vector<zmq::message_t> frames;
    for (uint32_t n = 0; n < options_.max_messages_per_wake; ++n) {
      if (!recv_message(rank.socket, &frames)) return;
      uint64_t seq = 0;
      if (frames.size() != 3 || !proto::decode_kv_event_seq(bytes_of(frames[1]), &seq)) {
        count(key, [](KvEventsNodeStats& s) { ++s.bad_messages; });
        continue;
      }
      on_message(key, rank, seq, bytes_of(frames[2]));
      if (rank.replay) return;  // the rest waits in the socket until the replay ends
    }
  }

  // One whole multipart message, without waiting. False when none is queued.
  static bool recv_message(zmq::socket_t& socket, std::vector<zmq::message_t>* frames) {
    frames->clear();
    try {
      zmq::message_t frame;
      if (!socket.recv(frame, zmq::recv_flags::dontwait)) return false;
      bool more = frame.more();
      frames->push_back(std::move(frame));
      while (more) {
        zmq::message_t next;
        if (!socket.recv(next, zmq::recv_flags::none)) break;
        more = next.more();
        // Keep at most one frame past the three expected: enough to tell the message is bad.
        if (frames->size() < 4) frames->push_back(std::move(next));
      }
      return true;
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  void on_message(const std::string& key, Rank& rank, uint64_t seq,
                  std::span<const std::byte> payload) {
    if (!rank.last_seq) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      auto it = stats_.find(key);
      if (it != stats_.end()) ++it->second.ranks_seen;
    } else if (seq <= *rank.last_seq) {
      pdr::log::info("kv_events: {} DP rank {}: seq went back from {} to {} (publisher restart): "
                   "the rank's entries dropped", key, rank.rank, *rank.last_seq, seq);
      index_.drop_rank(key, rank.rank);
      count(key, [](KvEventsNodeStats& s) { ++s.publisher_restarts; });
    } else if (seq != *rank.last_seq + 1) {
      if (start_replay(key, rank, *rank.last_seq + 1, seq, payload)) return;
      drop_for_gap(key, rank, *rank.last_seq + 1, seq);
    }
    rank.last_seq = seq;
    apply(key, rank.rank, payload);
  }

  // Decodes and applies one batch; a batch that does not decode drops the rank's entries.
  bool apply(const std::string& key, uint32_t dp_rank, std::span<const std::byte> payload) {
    proto::KvEventBatch batch;
    if (Status s = proto::decode_kv_event_batch(payload, options_.limits, &batch); !s) {
      pdr::log::debug("kv_events: {} DP rank {}: undecodable batch: {}", key, dp_rank, s.message());
      index_.drop_rank(key, dp_rank);
      count(key, [](KvEventsNodeStats& st) { ++st.decode_errors; });
      return false;
    }
    index_.apply(key, dp_rank, batch);
    const size_t events = batch.events.size();
    count(key, [events](KvEventsNodeStats& st) {
      ++st.batches;
      st.events += events;
    });
    return true;
  }

  // Batches [from, until) are missing and will not be replayed: the rank's entries go.
  void drop_for_gap(const std::string& key, Rank& rank, uint64_t from, uint64_t until) {
    pdr::log::info("kv_events: {} DP rank {}: batches {}..{} missed: the rank's entries dropped",
                 key, rank.rank, from, until - 1);
    index_.drop_rank(key, rank.rank);
    count(key, [](KvEventsNodeStats& s) { ++s.gaps; });
  }

  // Batches [from, until) are missing: asks the rank's replay socket for them (["", from]) and
  // holds `payload` (batch `until`) until the answers are in. False when the rank has no replay
  // socket or the request cannot be sent (the caller drops the rank's entries).
  bool start_replay(const std::string& key, Rank& rank, uint64_t from, uint64_t until,
                    std::span<const std::byte> payload) {
    if (rank.replay_endpoint.empty()) return false;
    try {
      auto r = std::make_unique<Replay>();
      r->dealer = zmq::socket_t(*context_, zmq::socket_type::dealer);
      r->dealer.set(zmq::sockopt::linger, 0);
      r->dealer.set(zmq::sockopt::ipv6, 1);
      r->dealer.set(zmq::sockopt::maxmsgsize,
                    static_cast<int64_t>(options_.limits.max_payload_bytes) + kFrameSlack);
      r->dealer.connect(rank.replay_endpoint);
      const std::string start = proto::encode_kv_event_seq(from);
      r->dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
      r->dealer.send(zmq::buffer(start), zmq::send_flags::none);
      r->from = r->expected = from;
      r->until = until;
      r->deadline = Clock::now() + options_.replay_timeout;
      r->held.assign(payload.begin(), payload.end());
      rank.replay = std::move(r);
      rebuild_ = true;
      return true;
    } catch (const zmq::error_t& e) {
      pdr::log::warn("kv_events: {} DP rank {}: replay from {} failed: {}", key, rank.rank,
                   rank.replay_endpoint, e.what());
      count(key, [](KvEventsNodeStats& s) { ++s.replay_failures; });
      return false;
    }
  }

  // Reads what the replay socket has sent (at most max_messages_per_wake), applying batches in
  // order; ends the replay on its end marker, a batch out of order or a bad message.
  void read_replay(const std::string& key, Rank& rank) {
    Replay& r = *rank.replay;
    std::vector<zmq::message_t> frames;
    for (uint32_t n = 0; n < options_.max_messages_per_wake; ++n) {
      if (!recv_message(r.dealer, &frames)) return;
      uint64_t seq = 0;
      if (frames.size() != 3 || frames[0].size() != 0 ||
          !proto::decode_kv_event_seq(bytes_of(frames[1]), &seq)) {
        count(key, [](KvEventsNodeStats& s) { ++s.bad_messages; });
        return end_replay(key, rank, false);
      }
      if (seq == proto::kKvReplayEnd) return end_replay(key, rank, r.expected >= r.until);
      if (++r.received > kMaxReplayMessages) return end_replay(key, rank, false);
      if (seq >= r.until) continue;  // the SUB socket delivers these itself
      // Out of order: the publisher's buffer no longer holds the start of the gap.
      if (seq != r.expected) return end_replay(key, rank, false);
      if (!apply(key, rank.rank, bytes_of(frames[2]))) return end_replay(key, rank, false);
      ++r.expected;
    }
  }

  // Replays past their deadline end as failures.
  void expire_replays() {
    if (!replaying_) return;
    const auto now = Clock::now();
    for (auto& [key, node] : nodes_) {
      for (Rank& rank : node.ranks) {
        if (rank.replay && now >= rank.replay->deadline) {
          pdr::log::info("kv_events: {} DP rank {}: replay from {} timed out", key, rank.rank,
                       rank.replay->from);
          end_replay(key, rank, false);
        }
      }
    }
  }

  // Counts the outcome (a failed replay drops the rank's entries), applies the held live batch
  // and lets the rank's SUB socket be read again, starting with what queued meanwhile.
  void end_replay(const std::string& key, Rank& rank, bool filled) {
    std::unique_ptr<Replay> r = std::move(rank.replay);
    if (filled) {
      count(key, [](KvEventsNodeStats& s) { ++s.replays; });
    } else {
      count(key, [](KvEventsNodeStats& s) { ++s.replay_failures; });
      drop_for_gap(key, rank, r->from, r->until);
    }
    rank.last_seq = r->until;
    apply(key, rank.rank, r->held);
    rebuild_ = true;
    drain(key, rank);
  }

  const SnapshotCell<discovery::RegistrySnapshot>& registry_;
  BlockIndex& index_;
  KvEventsSubscriberOptions options_;
  int wake_fd_ = -1;
  std::thread thread_;
  // Subscriber thread only.
  std::unique_ptr<zmq::context_t> context_;
  std::map<std::string, Node> nodes_;
  bool rebuild_ = true;  // the poll set no longer matches nodes_ (subscriptions, replays)
  // Some rank had a replay in flight at the last rebuild (every start and end of one rebuilds):
  // without one, the per-iteration scans for replay deadlines are skipped.
  bool replaying_ = false;
  // Any thread, under stats_mu_.
  mutable std::mutex stats_mu_;
  std::map<std::string, KvEventsNodeStats> stats_;
  KvEventsNodeStats totals_;  // counters only; subscribed_ranks, ranks_seen summed on read
};

KvEventsSubscriber::KvEventsSubscriber(
    const SnapshotCell<discovery::RegistrySnapshot>& registry, BlockIndex& index)
    : index_(index), impl_(std::make_unique<Impl>(registry, index)) {}

KvEventsSubscriber::~KvEventsSubscriber() { stop(); }

Status KvEventsSubscriber::start(const KvEventsSubscriberOptions& options) {
  return impl_->start(options);
}

void KvEventsSubscriber::stop() { impl_->stop(); }

std::vector<KvEventsNodeStats> KvEventsSubscriber::node_stats() const {
  return impl_->node_stats();
}

KvEventsNodeStats KvEventsSubscriber::totals() const { return impl_->totals(); }

}  // namespace pdr::router::cache
