// hopwise-link-delay: holds every packet an iptables NFQUEUE rule hands it for a fixed time, then lets it pass:
// the link delay of scripts/local-cluster.sh shape, for kernels without netem. It runs inside each emulated
// host on the packets arriving there (holding at the receiver keeps the sender's TCP clock honest).
//   hopwise-link-delay --queue N --delay-us D
// Packets leave in arrival order; SIGTERM releases everything still held and exits.
// netinet/in.h before the kernel's headers, or they define struct in_addr twice.
#include <netinet/in.h>
// clang-format off
#include <fcntl.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <linux/netfilter.h>
// clang-format on
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <string>

namespace {

volatile std::sig_atomic_t g_stop = 0;

std::int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Held {
  std::uint32_t id;
  std::int64_t due_ns;
};

struct State {
  std::int64_t delay_ns = 0;
  std::deque<Held> held;
};

int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* data) {
  auto* s = static_cast<State*>(data);
  if (nfqnl_msg_packet_hdr* h = nfq_get_msg_packet_hdr(nfa))
    s->held.push_back({ntohl(h->packet_id), now_ns() + s->delay_ns});
  return 0;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "hopwise-link-delay: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int queue = 0;
  long delay_us = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--queue") == 0)
      queue = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--delay-us") == 0)
      delay_us = std::atol(argv[i + 1]);
  }
  if (delay_us < 0 || argc != 5) {
    std::fprintf(stderr, "usage: hopwise-link-delay --queue N --delay-us MICROSECONDS\n");
    return 2;
  }
  State state;
  state.delay_ns = delay_us * 1000;
  std::signal(SIGTERM, [](int) { g_stop = 1; });
  std::signal(SIGINT, [](int) { g_stop = 1; });
  prctl(PR_SET_TIMERSLACK, 1UL);  // wake-ups within a microsecond, not the default 50

  nfq_handle* h = nfq_open();
  if (h == nullptr) fail("nfq_open (needs CAP_NET_ADMIN in this namespace)");
  nfq_unbind_pf(h, AF_INET);
  if (nfq_bind_pf(h, AF_INET) < 0) fail("nfq_bind_pf");
  nfq_q_handle* qh = nfq_create_queue(h, static_cast<std::uint16_t>(queue), &on_packet, &state);
  if (qh == nullptr) fail("nfq_create_queue " + std::to_string(queue));
  if (nfq_set_mode(qh, NFQNL_COPY_META, 0) < 0) fail("nfq_set_mode");
  nfq_set_queue_maxlen(qh, 1 << 16);
  // A full queue lets packets through rather than dropping them.
  nfq_set_queue_flags(qh, NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_FAIL_OPEN);
  nfnl_rcvbufsiz(nfq_nfnlh(h), 16 << 20);
  const int fd = nfq_fd(h);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  alignas(8) static char buf[1 << 16];
  while (!g_stop) {
    std::int64_t wait_ns = 100000000;
    if (!state.held.empty()) wait_ns = std::max<std::int64_t>(0, state.held.front().due_ns - now_ns());
    pollfd p{fd, POLLIN, 0};
    const timespec ts{static_cast<time_t>(wait_ns / 1000000000), static_cast<long>(wait_ns % 1000000000)};
    if (ppoll(&p, 1, &ts, nullptr) > 0) {
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
          nfq_handle_packet(h, buf, static_cast<int>(n));
          continue;
        }
        // ENOBUFS: notices were lost; their packets go with the next verdict, which covers every lower id.
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ENOBUFS)) break;
        if (n < 0) fail("recv");
        break;
      }
    }
    // Ids rise in arrival order, so one verdict releases every packet that is due.
    const std::int64_t t = now_ns();
    bool any = false;
    std::uint32_t last = 0;
    while (!state.held.empty() && state.held.front().due_ns <= t) {
      last = state.held.front().id;
      any = true;
      state.held.pop_front();
    }
    if (any) nfq_set_verdict_batch(qh, last, NF_ACCEPT);
  }
  if (!state.held.empty()) nfq_set_verdict_batch(qh, state.held.back().id, NF_ACCEPT);
  nfq_destroy_queue(qh);
  nfq_close(h);
  return 0;
}
