#include "router/cache/kv_events_subscriber.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <span>
#include <thread>
#include "proto/base/log.h"
#include "proto/base/log_limiter.h"
#include "proto/kv_events_replay.h"
#include "router/cache/kv_events_rate_limit.h"
#include <zmq.hpp>

namespace pdr::router::cache {

namespace {

using Clock = std::chrono::steady_clock;

// Frames beyond a payload's limit: topic and seq are small, this leaves room for a long topic.
constexpr int64_t kFrameSlack = 4096;
constexpr uint64_t kMaxReplayMessages = 1'000'000;  // vLLM's buffer_steps default is 10000
// ZMQ sockets beside the SUB sockets: one replay DEALER per subscription at most, and a margin.
constexpr int kSocketMargin = 16;

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

uint64_t process_fd_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
  return limit.rlim_cur;
}

}  // namespace

uint32_t subscription_budget(uint64_t fd_limit, uint32_t configured) {
  configured = std::max<uint32_t>(1, configured);
  if (fd_limit == 0 || fd_limit >= (uint64_t{1} << 40)) return configured;
  return static_cast<uint32_t>(std::clamp<uint64_t>(fd_limit / 4 / 4, 1, configured));
}

class KvEventsSubscriber::Impl {
 public:
  Impl(const SnapshotCell<discovery::RegistrySnapshot>& registry, BlockIndex& index)
      : registry_(registry), index_(index) {}

  ~Impl() { stop(); }

  Status start(const KvEventsSubscriberOptions& options) {
    options_ = options;
    options_.max_ranks_per_node = std::max<uint32_t>(1, options_.max_ranks_per_node);
    options_.max_messages_per_turn = std::max<uint32_t>(1, options_.max_messages_per_turn);
    max_batch_bytes_ = std::min<uint64_t>(options_.limits.max_payload_bytes,
                                          std::max<uint64_t>(1, options_.max_node_bytes_per_sec));
    options_.limits.max_payload_bytes = max_batch_bytes_;
    const uint64_t fd_limit = process_fd_limit();
    max_subscriptions_ = subscription_budget(fd_limit, options_.max_subscriptions);
    if (max_subscriptions_ < options_.max_subscriptions) {
      pdr::log::warn("kv_events: the open-file limit {} holds {} of kv_events.max_subscriptions {} "
                     "(4 descriptors each, a quarter of the limit); raise the limit for more",
                     fd_limit, max_subscriptions_, options_.max_subscriptions);
    }
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return Status(StatusCode::kInternal, "kv_events: eventfd failed");
    try {
      context_ = std::make_unique<zmq::context_t>(1);
      // libzmq's default (1023) would refuse sockets long before the budget says so.
      context_->set(zmq::ctxopt::max_sockets, static_cast<int>(2 * max_subscriptions_) + kSocketMargin);
    } catch (const zmq::error_t& e) {
      ::close(wake_fd_);
      wake_fd_ = -1;
      return Status(StatusCode::kInternal, std::string("kv_events: ZMQ context: ") + e.what());
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  void stop() {
    if (!thread_.joinable()) return;
    stopping_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
    thread_.join();
    ::close(wake_fd_);
    wake_fd_ = -1;
  }

  uint32_t max_subscriptions() const { return max_subscriptions_; }
  size_t max_batch_bytes() const { return max_batch_bytes_; }

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
        t.wanted_ranks += s.wanted_ranks;
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
    bool seen = false;            // delivered a message since (re)subscribing
    std::optional<uint64_t> last_seq;
    std::unique_ptr<Replay> replay;  // set while a replay is in flight
    // Messages are being discarded over the node's allowance: its entries are already dropped.
    bool shedding = false;
  };
  // Where a poll item points: a rank's SUB socket, or its replay DEALER.
  struct Owner {
    std::string node;
    size_t rank;
    bool replay;
  };
  struct Node {
    Node(const Wanted& w, const KvEventsSubscriberOptions& o, Clock::time_point now)
        : wanted(w), allowance(o.max_node_batches_per_sec, o.max_node_bytes_per_sec, now) {}
    Wanted wanted;
    // Subscribed ranks, in the order they were opened (a retry appends; poll owners index this).
    std::vector<Rank> ranks;
    uint32_t target = 0;  // ranks wanted: dp_size within max_ranks_per_node and the port range
    KvEventsRateLimit allowance;
  };

  // Applies `fn` to the node's counters and to the totals (same field).
  template <typename Fn>
  void count(const std::string& key, Fn&& fn) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    auto it = stats_.find(key);
    if (it != stats_.end()) fn(it->second);
    fn(totals_);
  }

  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  // Between two messages: something the loop must see first (stop, a new registry snapshot, the
  // registry timer) ends the current turn and pass.
  bool interrupted(Clock::time_point now) const {
    return stopping() || registry_.version() != registry_version_ || now >= next_registry_check_;
  }

  void run() {
    SnapshotReader<discovery::RegistrySnapshot> reader(registry_);
    // Held, not just its address: a freed snapshot's address may come back for a new one.
    std::shared_ptr<const discovery::RegistrySnapshot> seen;
    std::vector<zmq::pollitem_t> items;
    std::vector<Owner> owners;  // poll item i+1 -> its socket's owner
    size_t next_first = 0;      // round-robin: the owner the next pass serves first
    next_registry_check_ = Clock::now();
    next_retry_ = Clock::now() + options_.resubscribe_interval;
    rebuild_ = true;
    while (!stopping()) {
      auto now = Clock::now();
      if (now >= next_registry_check_ || registry_.version() != registry_version_) {
        registry_version_ = registry_.version();
        const auto& snapshot = reader.get();
        if (snapshot && snapshot != seen) {
          seen = snapshot;
          sync(*snapshot);
          rebuild_ = true;
        }
        next_registry_check_ = now + options_.registry_poll;
      }
      if (missing_ranks_ && now >= next_retry_) {
        open_missing_ranks();
        next_retry_ = now + options_.resubscribe_interval;
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
        if (next_first >= owners.size()) next_first = 0;
        rebuild_ = false;
      }
      auto wake_at = next_registry_check_;
      if (missing_ranks_) wake_at = std::min(wake_at, next_retry_);
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
      // One pass: each ready socket gets one turn, starting one further along than the last pass
      // did, so the socket served first (and any socket a pass is cut short before) rotates.
      const size_t n = owners.size();
      const size_t first = next_first;
      next_first = n == 0 ? 0 : (first + 1) % n;
      for (size_t k = 0; k < n; ++k) {
        const size_t o = (first + k) % n;
        if (!(items[o + 1].revents & ZMQ_POLLIN)) continue;
        const Owner& owner = owners[o];
        auto it = nodes_.find(owner.node);
        if (it == nodes_.end()) continue;
        Rank& rank = it->second.ranks[owner.rank];
        if (owner.replay != (rank.replay != nullptr)) continue;  // changed since the poll began
        if (owner.replay) {
          read_replay(it->first, it->second, rank);
        } else {
          drain(it->first, it->second, rank);
        }
        if (interrupted(Clock::now())) {
          next_first = (o + 1) % n;  // the sockets after this one are served first next time
          break;
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
        if (subscriptions_log_.allow(Clock::now())) {
          pdr::log::info("kv_events: {} unsubscribed (gone, expired or without an endpoint)", it->first);
        }
        index_.drop_node(it->first);
        {
          std::lock_guard<std::mutex> lock(stats_mu_);
          stats_.erase(it->first);
        }
        sockets_open_ -= it->second.ranks.size();
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
          if (events_log_.allow(Clock::now())) {
            pdr::log::info("kv_events: {} restarted: its entries dropped", key);
          }
          had = w;
          for (Rank& r : it->second.ranks) {
            r.seen = false;
            r.last_seq.reset();
            r.shedding = false;
            r.replay.reset();  // its batches belong to the old run
          }
          rebuild_ = true;
          count(key, [](KvEventsNodeStats& s) { ++s.node_restarts; });
          reset_ranks_seen(key);
          continue;
        }
        sockets_open_ -= it->second.ranks.size();
        nodes_.erase(it);
      }
      subscribe(key, w);
    }
    // Departures may have freed sockets for nodes that got fewer ranks than they want.
    open_missing_ranks();
    next_retry_ = Clock::now() + options_.resubscribe_interval;
  }

  void reset_ranks_seen(const std::string& key) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    auto it = stats_.find(key);
    if (it != stats_.end()) it->second.ranks_seen = 0;
  }

  void subscribe(const std::string& key, const Wanted& w) {
    Node node(w, options_, Clock::now());
    // Rank r publishes on port + r (unless the node listed each rank's port): ranks past port
    // 65535 cannot exist.
    const uint32_t port_room = w.ports.empty() ? 65536u - w.endpoint.port : w.dp_size;
    node.target = std::min({w.dp_size, options_.max_ranks_per_node, port_room});
    const uint64_t over_cap = w.dp_size > options_.max_ranks_per_node
                                  ? w.dp_size - options_.max_ranks_per_node
                                  : 0;
    KvEventsNodeStats s;
    s.node = key;
    s.endpoint = proto::zmq_tcp_endpoint(w.endpoint);
    if (w.replay) s.replay_endpoint = proto::zmq_tcp_endpoint(*w.replay);
    s.wanted_ranks = w.dp_size;
    s.ranks_over_cap = over_cap;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_[key] = s;
      totals_.ranks_over_cap += over_cap;
    }
    if (w.dp_size > node.target && subscriptions_log_.allow(Clock::now())) {
      pdr::log::warn("kv_events: {} has dp_size {}: only ranks 0..{} are subscribed to "
                     "(kv_events.max_ranks_per_node {}, ports up to 65535)",
                     key, w.dp_size, node.target - 1, options_.max_ranks_per_node);
    }
    Node& placed = nodes_.insert_or_assign(key, std::move(node)).first->second;
    open_ranks(key, placed);
    if (subscriptions_log_.allow(Clock::now())) {
      pdr::log::info("kv_events: {} subscribed to {} ({} of {} DP rank(s)){}", key, s.endpoint,
                     placed.ranks.size(), w.dp_size,
                     s.replay_endpoint.empty() ? "" : ", replay " + s.replay_endpoint);
    }
  }

  // Opens the node's ranks below its target that have no socket yet, while the subscription
  // budget lasts. Ranks that cannot be opened now are left for a retry.
  void open_ranks(const std::string& key, Node& node) {
    if (node.ranks.size() >= node.target) return;
    std::vector<bool> open(node.target, false);
    for (const Rank& r : node.ranks) open[r.rank] = true;
    const size_t before = node.ranks.size();
    for (uint32_t rank = 0; rank < node.target; ++rank) {
      if (open[rank]) continue;
      if (sockets_open_ >= max_subscriptions_) break;
      const std::string endpoint =
          proto::zmq_tcp_rank_endpoint(node.wanted.endpoint, node.wanted.ports, rank);
      Rank r;
      r.rank = rank;
      if (node.wanted.replay) {
        r.replay_endpoint =
            proto::zmq_tcp_rank_endpoint(*node.wanted.replay, node.wanted.replay_ports, rank);
      }
      try {
        r.socket = zmq::socket_t(*context_, zmq::socket_type::sub);
        configure(r.socket);
        r.socket.set(zmq::sockopt::subscribe, options_.topic);
        r.socket.connect(endpoint);
      } catch (const zmq::error_t& e) {
        // DNS names are resolved by libzmq at connect; a name it refuses outright lands here, as
        // does running out of sockets or descriptors (retried later).
        if (subscriptions_log_.allow(Clock::now())) {
          pdr::log::warn("kv_events: {} DP rank {}: cannot connect to {}: {}", key, rank, endpoint,
                         e.what());
        }
        break;
      }
      node.ranks.push_back(std::move(r));
      ++sockets_open_;
    }
    if (node.ranks.size() != before) {
      rebuild_ = true;
      std::lock_guard<std::mutex> lock(stats_mu_);
      auto it = stats_.find(key);
      if (it != stats_.end()) it->second.subscribed_ranks = static_cast<uint32_t>(node.ranks.size());
    }
  }

  // Every node short of its target gets another try; missing_ranks_ says whether one remains.
  void open_missing_ranks() {
    missing_ranks_ = false;
    for (auto& [key, node] : nodes_) {
      open_ranks(key, node);
      missing_ranks_ = missing_ranks_ || node.ranks.size() < node.target;
    }
  }

  // The bounds every socket reading a node's messages has (see the header's Bounds).
  void configure(zmq::socket_t& socket) const {
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::ipv6, 1);  // else libzmq refuses tcp://[v6]:port
    socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(max_batch_bytes_) + kFrameSlack);
    socket.set(zmq::sockopt::rcvhwm, options_.rcvhwm);
  }

  // One turn of one rank's SUB socket: at most max_messages_per_turn messages and turn_budget.
  void drain(const std::string& key, Node& node, Rank& rank) {
    const auto deadline = Clock::now() + options_.turn_budget;
    std::vector<zmq::message_t> frames;
    for (uint32_t n = 0; n < options_.max_messages_per_turn; ++n) {
      if (n > 0) {
        const auto now = Clock::now();
        if (now >= deadline || interrupted(now)) return;
      }
      if (!recv_message(rank.socket, &frames)) return;
      if (!node.allowance.admit(size_of(frames), Clock::now())) {
        shed(key, rank);
        continue;
      }
      uint64_t seq = 0;
      if (frames.size() != 3 || !proto::decode_kv_event_seq(bytes_of(frames[1]), &seq)) {
        count(key, [](KvEventsNodeStats& s) { ++s.bad_messages; });
        continue;
      }
      rank.shedding = false;
      on_message(key, rank, seq, bytes_of(frames[2]));
      if (rank.replay) return;  // the rest waits in the socket until the replay ends
    }
  }

  static uint64_t size_of(const std::vector<zmq::message_t>& frames) {
    uint64_t bytes = 0;
    for (const zmq::message_t& f : frames) bytes += f.size();
    return bytes;
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
        // Keep at most one frame past the four a replay answer may have: enough to tell it is bad.
        if (frames->size() < 5) frames->push_back(std::move(next));
      }
      return true;
    } catch (const zmq::error_t&) {
      return false;
    }
  }

  // A message over the node's allowance, discarded undecoded: the rank's index misses its events,
  // so the first one drops the rank's entries (a gap); the next message that fits starts the rank
  // again as after a resubscription.
  void shed(const std::string& key, Rank& rank) {
    count(key, [](KvEventsNodeStats& s) { ++s.rate_limited; });
    if (rank.shedding) return;
    rank.shedding = true;
    rank.last_seq.reset();
    if (events_log_.allow(Clock::now())) {
      pdr::log::info("kv_events: {} DP rank {}: over the node's allowance ({} batches/s, {} bytes/s): "
                     "batches discarded, the rank's entries dropped", key, rank.rank,
                     options_.max_node_batches_per_sec, options_.max_node_bytes_per_sec);
    }
    index_.drop_rank(key, rank.rank);
    count(key, [](KvEventsNodeStats& s) { ++s.gaps; });
  }

  void on_message(const std::string& key, Rank& rank, uint64_t seq,
                  std::span<const std::byte> payload) {
    if (!rank.seen) {
      rank.seen = true;
      std::lock_guard<std::mutex> lock(stats_mu_);
      auto it = stats_.find(key);
      if (it != stats_.end()) ++it->second.ranks_seen;
    }
    if (!rank.last_seq) {
      // The first message since (re)subscribing or since batches were discarded: accepted as is.
    } else if (seq <= *rank.last_seq) {
      if (events_log_.allow(Clock::now())) {
        pdr::log::info("kv_events: {} DP rank {}: seq went back from {} to {} (publisher restart): "
                       "the rank's entries dropped", key, rank.rank, *rank.last_seq, seq);
      }
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
    if (events_log_.allow(Clock::now())) {
      pdr::log::info("kv_events: {} DP rank {}: batches {}..{} missed: the rank's entries dropped",
                     key, rank.rank, from, until - 1);
    }
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
      configure(r->dealer);
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
      if (events_log_.allow(Clock::now())) {
        pdr::log::warn("kv_events: {} DP rank {}: replay from {} failed: {}", key, rank.rank,
                       rank.replay_endpoint, e.what());
      }
      count(key, [](KvEventsNodeStats& s) { ++s.replay_failures; });
      return false;
    }
  }

  // One turn of a replay socket: applies the batches it sent, in order; ends the replay on its
  // end marker, a batch out of order, a bad message or one over the node's allowance.
  void read_replay(const std::string& key, Node& node, Rank& rank) {
    Replay& r = *rank.replay;
    const auto deadline = Clock::now() + options_.turn_budget;
    std::vector<zmq::message_t> frames;
    std::vector<std::span<const std::byte>> spans;
    for (uint32_t n = 0; n < options_.max_messages_per_turn; ++n) {
      if (n > 0) {
        const auto now = Clock::now();
        if (now >= deadline || interrupted(now)) return;
      }
      if (!recv_message(r.dealer, &frames)) return;
      spans.clear();
      for (const zmq::message_t& f : frames) spans.push_back(bytes_of(f));
      proto::KvReplayAnswer answer;
      if (!proto::decode_kv_replay_answer(spans, &answer)) {
        count(key, [](KvEventsNodeStats& s) { ++s.bad_messages; });
        return end_replay(key, rank, false);
      }
      if (answer.end) return end_replay(key, rank, r.expected >= r.until);
      if (++r.received > kMaxReplayMessages) return end_replay(key, rank, false);
      if (answer.seq >= r.until) continue;  // the SUB socket delivers these itself
      if (!node.allowance.admit(size_of(frames), Clock::now())) {
        count(key, [](KvEventsNodeStats& s) { ++s.rate_limited; });
        return end_replay(key, rank, false);
      }
      // Out of order: the publisher's buffer no longer holds the start of the gap.
      if (answer.seq != r.expected) return end_replay(key, rank, false);
      if (!apply(key, rank.rank, answer.payload)) return end_replay(key, rank, false);
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
          if (events_log_.allow(now)) {
            pdr::log::info("kv_events: {} DP rank {}: replay from {} timed out", key, rank.rank,
                           rank.replay->from);
          }
          end_replay(key, rank, false);
        }
      }
    }
  }

  // Counts the outcome (a failed replay drops the rank's entries), applies the held live batch
  // and lets the rank's SUB socket be polled again (what queued meanwhile is read on its turns).
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
  }

  const SnapshotCell<discovery::RegistrySnapshot>& registry_;
  BlockIndex& index_;
  KvEventsSubscriberOptions options_;
  size_t max_batch_bytes_ = 0;
  uint32_t max_subscriptions_ = 0;
  int wake_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  // Subscriber thread only (context_ is made by start(), before the thread).
  std::unique_ptr<zmq::context_t> context_;
  std::map<std::string, Node> nodes_;
  size_t sockets_open_ = 0;     // SUB sockets over every node
  bool missing_ranks_ = false;  // some node has fewer ranks than its target: retried on a timer
  Clock::time_point next_retry_;
  uint64_t registry_version_ = 0;  // the SnapshotCell version last looked at
  Clock::time_point next_registry_check_;
  bool rebuild_ = true;  // the poll set no longer matches nodes_ (subscriptions, replays)
  // Some rank had a replay in flight at the last rebuild (every start and end of one rebuilds):
  // without one, the per-iteration scans for replay deadlines are skipped.
  bool replaying_ = false;
  LogLimiter events_log_{"kv_events"};  // gaps, restarts, replays, discarded batches
  LogLimiter subscriptions_log_{"kv_events subscriptions"};
  // Any thread, under stats_mu_.
  mutable std::mutex stats_mu_;
  std::map<std::string, KvEventsNodeStats> stats_;
  KvEventsNodeStats totals_;  // counters only; wanted/subscribed_ranks, ranks_seen summed on read
};

KvEventsSubscriber::KvEventsSubscriber(
    const SnapshotCell<discovery::RegistrySnapshot>& registry, BlockIndex& index)
    : index_(index), impl_(std::make_unique<Impl>(registry, index)) {}

KvEventsSubscriber::~KvEventsSubscriber() { stop(); }

Status KvEventsSubscriber::start(const KvEventsSubscriberOptions& options) {
  return impl_->start(options);
}

void KvEventsSubscriber::stop() { impl_->stop(); }

uint32_t KvEventsSubscriber::max_subscriptions() const { return impl_->max_subscriptions(); }

size_t KvEventsSubscriber::max_batch_bytes() const { return impl_->max_batch_bytes(); }

std::vector<KvEventsNodeStats> KvEventsSubscriber::node_stats() const {
  return impl_->node_stats();
}

KvEventsNodeStats KvEventsSubscriber::totals() const { return impl_->totals(); }

}  // namespace pdr::router::cache
