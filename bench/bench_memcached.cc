// bench_memcached: the same memcached and the same client, on kernel TCP
// loopback and under libgpusock_preload.so (fabric:shm, fabric:tcp), in one
// run. Reports ops/s and latency percentiles per transport and, last, their
// ratios to kernel TCP (BM_Ratio/*).
//
// Each BM_Memcached/<transport> starts /usr/bin/memcached (under the shim for
// the gpusock transports), then runs this binary again as the client
// (--client; under the shim too): closed-loop text-protocol gets and sets,
// one connection per client thread, one request in flight per connection,
// latency measured per request. Nothing here judges the numbers.
//
// Options (before the Google Benchmark ones):
//   --memcached=PATH       memcached binary (/usr/bin/memcached)
//   --preload=PATH         the shim (the one this build made)
//   --seconds=S            measured time per transport (3)
//   --clients=N            client threads = connections (2)
//   --server-threads=N     memcached -t (2)
//   --value-size=B         bytes per value (64)
//   --get-ratio=R          share of gets (0.9)
//   --port=P               first port; each transport uses its own (24600)
#include "test-support/resources.h"

#include <benchmark/benchmark.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <latch>
#include <thread>
#include <vector>

#ifndef GS_PRELOAD_LIBRARY
#define GS_PRELOAD_LIBRARY ""
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string memcached = "/usr/bin/memcached";
  std::string preload = GS_PRELOAD_LIBRARY;
  double seconds = 3;
  int clients = 2;
  int server_threads = 2;
  int value_size = 64;
  double get_ratio = 0.9;
  int port = 24600;
  int server_pid = 0;  // client mode: the server whose CPU the window reports
} g_opt;

struct Result {
  double ops_per_s = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, p999_us = 0, max_us = 0;
  double seconds = 0;
  long ops = 0;
  double server_cpu_us_per_op = 0, client_cpu_us_per_op = 0;
  // Over the measured window only (no start-up, connects or warm-up).
  double server_window_cpu_us_per_op = 0, client_window_cpu_us_per_op = 0;
};
std::map<std::string, Result> g_results;

// ------------------------------------------------------------------ client

bool write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads until the buffer ends with `end` (the reply's terminator).
bool read_reply(int fd, std::string &buf, const char *end) {
  buf.clear();
  const size_t elen = std::strlen(end);
  char tmp[4096];
  for (;;) {
    ssize_t r = read(fd, tmp, sizeof tmp);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    buf.append(tmp, static_cast<size_t>(r));
    if (buf.size() >= elen && buf.compare(buf.size() - elen, elen, end) == 0) return true;
  }
}

int connect_to(int port) {
  for (int tries = 0; tries < 200; ++tries) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    close(fd);
    usleep(50000);  // the server may still be starting
  }
  return -1;
}

constexpr int kKeys = 1000;

// CPU time (µs): of a finished process's rusage, of this process, and of
// process `pid` from /proc (-1 when it cannot be read).
double cpu_us(const rusage &ru) {
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

double own_cpu_us() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return cpu_us(ru);
}

double process_cpu_us(int pid) {
  gpusock::test::StatTicks ticks;
  if (pid <= 0 || !gpusock::test::read_stat_ticks("/proc/" + std::to_string(pid) + "/stat", &ticks)) return -1;
  return static_cast<double>(ticks.utime + ticks.stime) * 1e6 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int run_client(int port) {
  const std::string value(static_cast<size_t>(g_opt.value_size), 'v');
  std::vector<std::vector<float>> lat(static_cast<size_t>(g_opt.clients));
  std::vector<long> ops(static_cast<size_t>(g_opt.clients), 0);
  std::atomic<bool> failed{false};
  std::latch all_ready(g_opt.clients + 1);
  std::atomic<bool> measure{false}, stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < g_opt.clients; ++t) {
    threads.emplace_back([&, t] {
      const int fd = connect_to(port);
      if (fd < 0) {
        failed = true;
        all_ready.count_down();
        return;
      }
      std::string buf, req;
      auto set = [&](int k) {
        req = "set key:" + std::to_string(k) + " 0 0 " + std::to_string(value.size()) + "\r\n" + value + "\r\n";
        return write_all(fd, req.data(), req.size()) && read_reply(fd, buf, "\r\n") && buf == "STORED\r\n";
      };
      for (int k = t; k < kKeys; k += g_opt.clients)
        if (!set(k)) failed = true;
      // Every key is stored before the first get. Asleep, not polling: a
      // thousand threads polling starve the connects still under way.
      all_ready.arrive_and_wait();
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1u);
      std::uniform_int_distribution<int> key(0, kKeys - 1);
      std::uniform_real_distribution<double> coin(0, 1);
      auto &mine = lat[static_cast<size_t>(t)];
      mine.reserve(1 << 20);
      while (!stop.load(std::memory_order_relaxed) && !failed.load(std::memory_order_relaxed)) {
        const int k = key(rng);
        const auto t0 = Clock::now();
        bool ok;
        if (coin(rng) < g_opt.get_ratio) {
          req = "get key:" + std::to_string(k) + "\r\n";
          ok = write_all(fd, req.data(), req.size()) && read_reply(fd, buf, "END\r\n") && buf.size() > value.size();
        } else {
          ok = set(k);
        }
        if (!ok) {
          failed = true;
          break;
        }
        if (measure.load(std::memory_order_relaxed)) {
          mine.push_back(std::chrono::duration<float, std::micro>(Clock::now() - t0).count());
          ++ops[static_cast<size_t>(t)];
        }
      }
      close(fd);
    });
  }
  all_ready.arrive_and_wait();
  usleep(300000);  // warm-up, not measured
  const double server0 = process_cpu_us(g_opt.server_pid), client0 = own_cpu_us();
  const auto start = Clock::now();
  measure = true;
  std::this_thread::sleep_for(std::chrono::duration<double>(g_opt.seconds));
  measure = false;
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const double server1 = process_cpu_us(g_opt.server_pid), client1 = own_cpu_us();
  stop = true;
  for (auto &th : threads) th.join();
  if (failed) {
    std::fprintf(stdout, "error: a request failed\n");
    return 1;
  }
  std::vector<float> all;
  long total = 0;
  for (size_t t = 0; t < lat.size(); ++t) {
    all.insert(all.end(), lat[t].begin(), lat[t].end());
    total += ops[t];
  }
  if (all.empty()) {
    std::fprintf(stdout, "error: no request completed\n");
    return 1;
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all[std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())))];
  };
  std::fprintf(stdout, "result ops %ld seconds %.6f p50 %.2f p90 %.2f p99 %.2f p999 %.2f max %.2f\n", total, secs,
               pct(0.50), pct(0.90), pct(0.99), pct(0.999), all.back());
  std::fprintf(stdout, "window_cpu_us server %.0f client %.0f\n",
               server0 >= 0 && server1 >= 0 ? server1 - server0 : -1.0, client1 - client0);
  return 0;
}

// ------------------------------------------------------------------ driver

pid_t spawn(const std::vector<std::string> &argv, const std::vector<std::string> &env, int stdout_fd) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  for (const auto &e : env) putenv(const_cast<char *>(e.c_str()));
  if (stdout_fd >= 0) dup2(stdout_fd, 1);
  std::vector<char *> args;
  for (const auto &a : argv) args.push_back(const_cast<char *>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  _exit(127);
}

std::string self_exe() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  path[n] = 0;
  return path;
}

void BM_Memcached(benchmark::State &state, std::string transport, int port) {
  const bool shim = transport != "kernel";
  if (access(g_opt.memcached.c_str(), X_OK) != 0) {
    state.SkipWithError(("no memcached at " + g_opt.memcached).c_str());
    return;
  }
  if (shim && access(g_opt.preload.c_str(), R_OK) != 0) {
    state.SkipWithError(("no shim at '" + g_opt.preload + "' (--preload=PATH)").c_str());
    return;
  }
  std::vector<std::string> env;
  if (shim) {
    env.push_back("LD_PRELOAD=" + g_opt.preload);
    env.push_back("GPUSOCK_TRANSPORT=" + transport);
  }
  for (auto _ : state) {
    std::vector<std::string> server = {g_opt.memcached,
                                       "-U",
                                       "0",
                                       "-l",
                                       "127.0.0.1",
                                       "-p",
                                       std::to_string(port),
                                       "-t",
                                       std::to_string(g_opt.server_threads),
                                       "-m",
                                       "256",
                                       "-c",
                                       "1024"};
    if (geteuid() == 0) {
      server.push_back("-u");
      server.push_back("root");
    }
    const pid_t mc = spawn(server, env, -1);
    int out[2];
    if (pipe(out) < 0) {
      state.SkipWithError("pipe");
      break;
    }
    char fmt[64];
    std::snprintf(fmt, sizeof fmt, "%g", g_opt.seconds);
    std::vector<std::string> client = {self_exe(),
                                       "--client=" + std::to_string(port),
                                       "--seconds=" + std::string(fmt),
                                       "--clients=" + std::to_string(g_opt.clients),
                                       "--value-size=" + std::to_string(g_opt.value_size),
                                       "--get-ratio=" + std::to_string(g_opt.get_ratio),
                                       "--server-pid=" + std::to_string(mc)};
    const pid_t cl = spawn(client, env, out[1]);
    close(out[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    close(out[0]);
    int status = 0;
    rusage client_ru{}, server_ru{};
    wait4(cl, &status, 0, &client_ru);
    kill(mc, SIGTERM);
    wait4(mc, nullptr, 0, &server_ru);
    Result r;
    const char *line = std::strstr(text.c_str(), "result ");
    if (!line || std::sscanf(line, "result ops %ld seconds %lf p50 %lf p90 %lf p99 %lf p999 %lf max %lf", &r.ops,
                             &r.seconds, &r.p50_us, &r.p90_us, &r.p99_us, &r.p999_us, &r.max_us) != 7) {
      state.SkipWithError(("client failed: " + text).c_str());
      break;
    }
    r.ops_per_s = static_cast<double>(r.ops) / r.seconds;
    state.SetIterationTime(r.seconds);
    state.counters["ops_per_s"] = r.ops_per_s;
    state.counters["p50_us"] = r.p50_us;
    state.counters["p90_us"] = r.p90_us;
    state.counters["p99_us"] = r.p99_us;
    state.counters["p999_us"] = r.p999_us;
    state.counters["max_us"] = r.max_us;
    // CPU time of each process over its whole life (start-up and warm-up
    // included), per measured operation: busy-polling shows up here.
    r.server_cpu_us_per_op = cpu_us(server_ru) / static_cast<double>(r.ops);
    r.client_cpu_us_per_op = cpu_us(client_ru) / static_cast<double>(r.ops);
    state.counters["server_cpu_us_per_op"] = r.server_cpu_us_per_op;
    state.counters["client_cpu_us_per_op"] = r.client_cpu_us_per_op;
    // The same over the measured window alone (the client reads both).
    double server_window = -1, client_window = -1;
    if (const char *w = std::strstr(text.c_str(), "window_cpu_us ");
        w != nullptr && std::sscanf(w, "window_cpu_us server %lf client %lf", &server_window, &client_window) == 2) {
      if (server_window >= 0) {
        r.server_window_cpu_us_per_op = server_window / static_cast<double>(r.ops);
        state.counters["server_window_cpu_us_per_op"] = r.server_window_cpu_us_per_op;
      }
      r.client_window_cpu_us_per_op = client_window / static_cast<double>(r.ops);
      state.counters["client_window_cpu_us_per_op"] = r.client_window_cpu_us_per_op;
    }
    g_results[transport] = r;
  }
}

// Ratios of a gpusock transport to kernel TCP, from this run's results:
// ops_ratio > 1 and latency ratios < 1 mean gpusock is better.
void BM_Ratio(benchmark::State &state, std::string transport) {
  for (auto _ : state) {
    auto k = g_results.find("kernel"), g = g_results.find(transport);
    if (k == g_results.end() || g == g_results.end()) {
      state.SkipWithError("needs BM_Memcached/kernel and this transport in the same run");
      break;
    }
    const Result &a = g->second, &b = k->second;
    state.SetIterationTime(1e-9);
    state.counters["ops_ratio"] = a.ops_per_s / b.ops_per_s;
    state.counters["p50_ratio"] = a.p50_us / b.p50_us;
    state.counters["p90_ratio"] = a.p90_us / b.p90_us;
    state.counters["p99_ratio"] = a.p99_us / b.p99_us;
    state.counters["p999_ratio"] = a.p999_us / b.p999_us;
    state.counters["server_cpu_ratio"] = a.server_cpu_us_per_op / b.server_cpu_us_per_op;
    state.counters["client_cpu_ratio"] = a.client_cpu_us_per_op / b.client_cpu_us_per_op;
  }
}

bool take_option(const char *arg) {
  auto value = [&](const char *name) -> const char * {
    const size_t n = std::strlen(name);
    return std::strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : nullptr;
  };
  if (const char *v = value("--memcached")) g_opt.memcached = v;
  else if (const char *v = value("--preload")) g_opt.preload = v;
  else if (const char *v = value("--seconds")) g_opt.seconds = std::atof(v);
  else if (const char *v = value("--clients")) g_opt.clients = std::max(1, std::atoi(v));
  else if (const char *v = value("--server-threads")) g_opt.server_threads = std::max(1, std::atoi(v));
  else if (const char *v = value("--value-size")) g_opt.value_size = std::max(1, std::atoi(v));
  else if (const char *v = value("--get-ratio")) g_opt.get_ratio = std::atof(v);
  else if (const char *v = value("--port")) g_opt.port = std::atoi(v);
  else if (const char *v = value("--server-pid")) g_opt.server_pid = std::atoi(v);
  else return false;
  return true;
}

}  // namespace

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  int client_port = 0;
  std::vector<char *> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (!std::strncmp(argv[i], "--client=", 9)) client_port = std::atoi(argv[i] + 9);
    else if (!take_option(argv[i])) rest.push_back(argv[i]);
  }
  if (client_port) return run_client(client_port);

  int p = g_opt.port;
  for (const char *t : {"kernel", "fabric:shm", "fabric:tcp"}) {
    benchmark::RegisterBenchmark((std::string("BM_Memcached/") + t).c_str(), BM_Memcached, std::string(t), p)
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    p += 10;  // fresh ports: no TIME_WAIT or stale rendezvous between transports
  }
  for (const char *t : {"fabric:shm", "fabric:tcp"})
    benchmark::RegisterBenchmark((std::string("BM_Ratio/") + t + "_vs_kernel").c_str(), BM_Ratio, std::string(t))
        ->Iterations(1)
        ->UseManualTime();
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
