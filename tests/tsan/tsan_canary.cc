// The TSan stage's canary: proves that tests/tsan.supp silences libzmq's uninstrumented buffer
// hand-offs without hiding races in pdrouter's code. Built and registered with CTest in the TSan
// build alone (tests/tsan/CMakeLists.txt); each mode is one test:
//
//   own-race        two threads bump one plain counter: TSan must report it (a suppression
//                   file that hid every report would pass every other test).
//   race-beside-zmq the thread serving a ROUTER (as pdrouter's discovery thread does) bumps a
//                   plain counter per message while another thread reads it: TSan must report it,
//                   though both threads spend their time in libzmq.
//   zmq-traffic     discovery-shaped traffic (a ROUTER read and answered on one thread, its
//                   messages' payload and Peer-Address read; DEALERs connecting, sending and
//                   closing on another; then the same over CURVE): libzmq and libsodium, not built
//                   with TSan, hand message buffers between their I/O thread and the caller
//                   through lock-free queues TSan cannot see. TSan must report nothing and match
//                   no suppression either: each match is a race TSan detected and symbolised
//                   (about 7,000 a second here under the former `race:libzmq.so` alone).
//
// Exit code 0 when the mode ran to its end; whether TSan reported is the test's business (its
// PASS_ / FAIL_REGULAR_EXPRESSION).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq.hpp>

namespace {

using Clock = std::chrono::steady_clock;

// Deliberately unsynchronised: the races the canary wants reported.
long canary_own_counter = 0;
long canary_messages_served = 0;

void bump_own_counter() {
  for (int i = 0; i < 1000; ++i) ++canary_own_counter;
}

int own_race() {
  std::thread a(bump_own_counter);
  std::thread b(bump_own_counter);
  a.join();
  b.join();
  std::printf("counter %ld\n", canary_own_counter);
  return 0;
}

// One ROUTER served on the calling thread for `duration`, as the discovery thread serves it:
// each message's payload and Peer-Address read, then answered with a small ack to its sender.
long serve_router(zmq::socket_t& router, std::chrono::milliseconds duration, bool count_served = false) {
  long sum = 0;
  const auto end = Clock::now() + duration;
  zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0}};
  while (Clock::now() < end) {
    zmq::poll(items, 1, std::chrono::milliseconds(20));
    zmq::message_t identity, payload;
    while (router.recv(identity, zmq::recv_flags::dontwait)) {
      (void)router.recv(payload, zmq::recv_flags::dontwait);
      const auto* bytes = static_cast<const unsigned char*>(payload.data());
      for (size_t i = 0; i < payload.size(); ++i) sum += bytes[i];
      if (const char* peer = zmq_msg_gets(payload.handle(), "Peer-Address")) {
        sum += static_cast<long>(std::string_view(peer).size());
      }
      if (count_served) ++canary_messages_served;  // the racy write of race-beside-zmq
      const std::string ack(40, 'a');
      (void)router.send(zmq::buffer(identity.data(), identity.size()),
                        zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      (void)router.send(zmq::buffer(ack), zmq::send_flags::dontwait);
    }
  }
  return sum;
}

// DEALERs on their own context (a node's), each sending a few registrations and reading the acks
// before it closes, until `stop`.
void run_dealers(const std::string& endpoint, const std::string& server_key, std::atomic<bool>& stop) {
  zmq::context_t context(1);
  std::string body(300, 'x');
  for (int n = 0; !stop.load(); ++n) {
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    if (!server_key.empty()) {
      char public_key[41], secret_key[41];
      zmq_curve_keypair(public_key, secret_key);
      dealer.set(zmq::sockopt::curve_serverkey, server_key);
      dealer.set(zmq::sockopt::curve_publickey, std::string(public_key));
      dealer.set(zmq::sockopt::curve_secretkey, std::string(secret_key));
    }
    dealer.connect(endpoint);
    for (int i = 0; i < 10 && !stop.load(); ++i) {
      body[static_cast<size_t>(n * 10 + i) % body.size()] = static_cast<char>(n + i);
      (void)dealer.send(zmq::buffer(body), zmq::send_flags::dontwait);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      zmq::message_t ack;
      while (dealer.recv(ack, zmq::recv_flags::dontwait)) {
      }
    }
  }
}

int zmq_traffic() {
  zmq::context_t context(1);
  zmq::socket_t plain(context, zmq::socket_type::router);
  plain.set(zmq::sockopt::linger, 0);
  plain.bind("tcp://127.0.0.1:*");
  char server_public[41], server_secret[41];
  zmq_curve_keypair(server_public, server_secret);
  zmq::socket_t curve(context, zmq::socket_type::router);
  curve.set(zmq::sockopt::linger, 0);
  curve.set(zmq::sockopt::curve_server, 1);
  curve.set(zmq::sockopt::curve_secretkey, std::string(server_secret));
  curve.bind("tcp://127.0.0.1:*");
  long sum = 0;
  for (auto* router : {&plain, &curve}) {
    std::atomic<bool> stop{false};
    const std::string key = router == &curve ? std::string(server_public) : std::string();
    std::thread dealers(run_dealers, router->get(zmq::sockopt::last_endpoint), key, std::ref(stop));
    sum += serve_router(*router, std::chrono::milliseconds(1500));
    stop = true;
    dealers.join();
  }
  std::printf("served %ld\n", sum);
  return 0;
}

int race_beside_zmq() {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:*");
  std::thread server([&] { serve_router(router, std::chrono::milliseconds(1500), true); });
  std::atomic<bool> stop{false};
  std::thread dealers(run_dealers, router.get(zmq::sockopt::last_endpoint), std::string(), std::ref(stop));
  // The racy read, until the server has counted a few messages.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (canary_messages_served < 5 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  dealers.join();
  server.join();
  std::printf("served %ld\n", canary_messages_served);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode == "own-race") return own_race();
  if (mode == "race-beside-zmq") return race_beside_zmq();
  if (mode == "zmq-traffic") return zmq_traffic();
  std::fprintf(stderr, "usage: tsan_canary own-race|race-beside-zmq|zmq-traffic\n");
  return 2;
}
