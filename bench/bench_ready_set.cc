// bench_ready_set: what a wait over many idle gpusock sockets costs, one
// process, in-process peers over the transport GPUSOCK_TRANSPORT names.
//   bench_ready_set [N...]     (default 16 64 256 1024)
// For each N: N connected pairs; then the server ends are watched and the
// figures, in microseconds, are medians of 5 runs of many repetitions:
//   poll_pass        gs_poll over the N, timeout 0 (every socket looked at)
//   set_pass         gs_ready_set_poll over the N, all idle
//   set_find_one     a byte sent on one connection (a different one each
//                    time), found by gs_ready_set_poll, read
//   wait_begin_end   gs_wait_begin + gs_wait_end over the N
//   set_wait         gs_ready_set_wait_begin + _end over the N
// One JSON object per N on stdout. Numbers are not judged anywhere.
#include <gpusock/socket.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double median_us(int reps, F f) {
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) f(i);
    runs.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / reps);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

int measure(int n, int port) {
  const int l = gs_socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (l < 0 || gs_bind(l, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 || gs_listen(l, n + 8) != 0) {
    std::fprintf(stderr, "bench_ready_set: listen on %d: %s\n", port, gs_last_error());
    return 1;
  }
  std::vector<int> clients, servers;
  for (int i = 0; i < n; ++i) {
    const int c = gs_socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || gs_connect(c, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) return 1;
    const int s = gs_accept(l, nullptr, nullptr);
    if (s < 0) return 1;
    clients.push_back(c);
    servers.push_back(s);
  }
  std::vector<pollfd> fds;
  for (int s : servers) fds.push_back({s, POLLIN, 0});
  gs_ready_set_t *set = gs_ready_set_create();
  for (int s : servers) gs_ready_set_ctl(set, EPOLL_CTL_ADD, s, POLLIN);
  std::vector<pollfd> out(static_cast<size_t>(n));
  std::vector<pollfd> wait(static_cast<size_t>(n) + 8);
  const int reps = std::max(20, 20000 / n);
  gs_ready_set_poll(set, out.data(), n, nullptr);  // a first look: all known quiet

  const double poll_pass = median_us(reps, [&](int) { gs_poll(fds.data(), fds.size(), 0); });
  const double set_pass = median_us(reps, [&](int) { gs_ready_set_poll(set, out.data(), n, nullptr); });
  const double set_find_one = median_us(reps, [&](int i) {
    char b = 'x';
    gs_send(clients[static_cast<size_t>(i % n)], &b, 1, 0);
    int k;
    while ((k = gs_ready_set_poll(set, out.data(), n, nullptr)) == 0) {}
    for (int j = 0; j < k; ++j) gs_recv(out[static_cast<size_t>(j)].fd, &b, 1, 0);
  });
  const double wait_begin_end = median_us(reps, [&](int) {
    if (gs_wait_begin(fds.data(), fds.size(), wait.data(), wait.size()) >= 0) gs_wait_end(fds.data(), fds.size());
  });
  const double set_wait = median_us(reps, [&](int) {
    if (gs_ready_set_wait_begin(set, wait.data(), wait.size()) >= 0) gs_ready_set_wait_end(set);
  });
  std::printf(
      "{\"conns\":%d,\"poll_pass_us\":%.3f,\"set_pass_us\":%.3f,\"set_find_one_us\":%.3f,"
      "\"wait_begin_end_us\":%.3f,\"set_wait_us\":%.3f}\n",
      n, poll_pass, set_pass, set_find_one, wait_begin_end, set_wait);
  std::fflush(stdout);
  gs_ready_set_destroy(set);
  for (int fd : clients) gs_close(fd);
  for (int fd : servers) gs_close(fd);
  gs_close(l);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<int> counts;
  for (int i = 1; i < argc; ++i) counts.push_back(std::atoi(argv[i]));
  if (counts.empty()) counts = {16, 64, 256, 1024};
  const char *base = std::getenv("GS_BENCH_PORT");
  int port = base ? std::atoi(base) : 26600;
  for (int n : counts)
    if (n <= 0 || measure(n, port++) != 0) return 1;
  return 0;
}
