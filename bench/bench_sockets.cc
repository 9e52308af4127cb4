// bench_sockets: the rows of issue 10's benchmark table that need a server
// and a client of their own, on gpusock (fabric:tcp, fabric:shm) and with the
// same code on kernel TCP loopback (bench/socket_roles.h), in one run:
//   rtt        64 B round trip, one connection: median, mean and p99 per round trip
//   wake       a thread blocked in recv to the data's arrival: median and p99
//   conns      100 and 1,000 connections, closed-loop round trips: p50, p99, round trips/s
//   idle-poll  CPU ticks over 10 s of a server holding 100 idle connections,
//              blocked in poll, and of its client
//   idle-recv  the same with a thread blocked in recv on one connection
//
//   bench_sockets suite [--quick | --smoke] [--repetitions R] [--measures a,b,...]
//                       [--transports fabric:tcp,fabric:shm,kernel] [--json FILE]
//   bench_sockets serve|client MEASURE --transport T --port P [--conns N] [--seconds S] [--samples K]
//                 [--windows W]
//
// `suite` never calls gpusock itself (a transport is read once per process,
// and no libfabric state should exist where it spawns): every run is a serve
// and a client process of this binary. Figures are medians over the
// repetitions (conns: windows of one process pair; idle: one window of 10 s,
// a sum already); ticks are read from
// /proc/PID/stat (utime + stime) and per thread from /proc/PID/task. A
// fabric:shm run whose endpoints would not fit in /dev/shm is skipped with a
// message. Exit status 1 if a run failed; numbers are never judged here.
#include <sys/resource.h>
#include <sys/statvfs.h>

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "bench/socket_roles.h"
#include "test-support/gs_sockets.h"
#include "test-support/kernel_sockets.h"
#include "test-support/peer_process.h"
#include "test-support/resources.h"

namespace {

using namespace gpusock::bench;
using gpusock::test::PeerProcess;

struct Settings {
  int repetitions = 3;
  std::vector<std::string> measures = {"rtt", "wake", "conns", "idle-poll", "idle-recv"};
  std::vector<std::string> transports = {"fabric:tcp", "fabric:shm", "kernel"};
  double rtt_seconds = 1;
  int wake_samples = 200;
  std::vector<int> conn_counts = {100, 1000};
  double conn_seconds = 2;
  int idle_conns = 100;
  double idle_seconds = 10;
  double idle_settle_seconds = 1;  // after set-up, before the window opens
  std::string json_path;
};

struct Case {
  std::string measure, transport;
  int conns = 1;
  std::string name() const { return measure + " " + transport + " (" + std::to_string(conns) + " conn)"; }
};

struct Run {
  std::map<std::string, double> values;
  std::map<std::string, std::string> notes;
  std::string error;
};

struct Outcome {
  std::vector<Run> runs;
  std::string error, skipped;
};

[[noreturn]] void usage(const std::string &why) {
  std::fprintf(stderr,
               "bench_sockets: %s\nusage: bench_sockets suite [--quick|--smoke] [--repetitions R] [--measures a,b]\n"
               "                           [--transports a,b] [--json FILE]\n"
               "       bench_sockets serve|client MEASURE --transport T --port P [--conns N] [--seconds S] "
               "[--samples K] [--windows W]\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> split(const std::string &list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// ---------------------------------------------------------------------------
// CPU ticks from /proc

struct Ticks {
  long total = -1;
  std::map<std::string, long> threads;  // "comm/tid" ("main/tid" for the main thread) -> utime + stime
};

Ticks read_ticks(pid_t pid) {
  Ticks t;
  gpusock::test::StatTicks process;
  if (gpusock::test::read_stat_ticks("/proc/" + std::to_string(pid) + "/stat", &process))
    t.total = process.utime + process.stime;
  for (const auto &thread : gpusock::test::thread_ticks(std::to_string(pid))) {
    const bool main_thread = thread.tid == pid;
    t.threads[(main_thread ? "main" : thread.comm) + "/" + std::to_string(thread.tid)] = thread.utime + thread.stime;
  }
  return t;
}

// The threads that used CPU between two readings: "comm/tid:ticks ...".
std::string busy_threads(const Ticks &before, const Ticks &after) {
  std::string out;
  for (const auto &[name, ticks] : after.threads) {
    const auto was = before.threads.find(name);
    const long used = ticks - (was == before.threads.end() ? 0 : was->second);
    if (used > 0) out += (out.empty() ? "" : " ") + name + ":" + std::to_string(used);
  }
  return out.empty() ? "none" : out;
}

// ---------------------------------------------------------------------------
// One run: a serve and a client process

// fabric:shm maps a region in /dev/shm per endpoint (~4 MiB of it touched;
// GS_BENCH_SHM_MIB_PER_ENDPOINT overrides), two endpoints per connection.
std::string shm_shortfall(const Case &c) {
  if (c.transport != "fabric:shm") return "";
  const char *env = std::getenv("GS_BENCH_SHM_MIB_PER_ENDPOINT");
  const double mib = env && *env ? std::atof(env) : 4.0;
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) != 0) return "";
  const double free_mib = static_cast<double>(fs.f_bavail) * static_cast<double>(fs.f_frsize) / (1 << 20);
  const double need_mib = (2.0 * c.conns + 2) * mib;
  if (need_mib <= free_mib) return "";
  char why[320];
  std::snprintf(why, sizeof why,
                "%d connections on fabric:shm need ~%.0f MiB of /dev/shm (2 endpoints each, ~%.0f MiB per endpoint, "
                "GS_BENCH_SHM_MIB_PER_ENDPOINT); df /dev/shm: %.0f MiB free",
                c.conns, need_mib, mib, free_mib);
  return why;
}

// The next line of `p` starting with `wanted` or "error"; "" at EOF or timeout.
std::string await_line(PeerProcess &p, const std::string &wanted, double timeout_s) {
  std::string line;
  while (p.read_line(&line, timeout_s))
    if (line.rfind(wanted, 0) == 0 || line.rfind("error", 0) == 0) return line;
  return "";
}

// "result KEY VALUE ..." into run->values; anything else is the run's error.
bool take_result(const std::string &line, const char *role, Run *run) {
  if (line.rfind("result ", 0) != 0) {
    run->error = std::string(role) + ": " + (line.empty() ? "no answer (see its stderr)" : line);
    return false;
  }
  std::istringstream in(line.substr(7));
  std::string key;
  double value;
  while (in >> key >> value) run->values[key] = value;
  return true;
}

void sleep_s(double s) { usleep(static_cast<useconds_t>(s * 1e6)); }

// One serve and client pair: one Run, or for conns one per window.
std::vector<Run> run_pair(const Case &c, const Settings &s, int windows) {
  std::vector<Run> runs(1);
  Run &run = runs[0];
  const int port = gpusock::test::free_port();
  const double seconds = c.measure == "rtt" ? s.rtt_seconds : s.conn_seconds;
  auto args = [&](const char *role) {
    return std::vector<std::string>{role,          c.measure,
                                    "--transport", c.transport,
                                    "--port",      std::to_string(port),
                                    "--conns",     std::to_string(c.conns),
                                    "--seconds",   std::to_string(seconds),
                                    "--samples",   std::to_string(s.wake_samples),
                                    "--windows",   std::to_string(windows)};
  };
  const std::string self = gpusock::test::self_binary();
  const double answer_s = seconds + 120;  // set-up of 1,000 connections included
  PeerProcess server, client;
  std::string line;
  if (!server.spawn(self, args("serve"), {.in = true, .out = true}, &run.error)) return runs;
  line = await_line(server, "listening", 30);
  if (line != "listening") {
    run.error = "server: " + (line.empty() ? "did not start (see its stderr)" : line);
    return runs;
  }
  if (!client.spawn(self, args("client"), {.in = true, .out = true}, &run.error)) return runs;
  if (c.measure == "rtt") {
    take_result(await_line(client, "result", answer_s), "client", &run);
  } else if (c.measure == "conns") {
    runs.resize(static_cast<size_t>(windows));
    for (Run &window : runs)
      if (!take_result(await_line(client, "result", answer_s), "client", &window)) {
        runs = {window};
        break;
      }
  } else if (c.measure == "wake") {
    if (take_result(await_line(client, "result", answer_s), "client", &run))
      take_result(await_line(server, "result", 30), "server", &run);
  } else {
    const std::string server_ready = await_line(server, "ready", answer_s);
    const std::string client_ready = await_line(client, "ready", answer_s);
    if (server_ready != "ready" || client_ready != "ready") {
      run.error = server_ready != "ready" ? "server: " + (server_ready.empty() ? "no answer" : server_ready)
                                          : "client: " + (client_ready.empty() ? "no answer" : client_ready);
    } else {
      sleep_s(s.idle_settle_seconds);
      const Ticks server0 = read_ticks(server.pid()), client0 = read_ticks(client.pid());
      const gpusock::test::Stopwatch window;
      sleep_s(s.idle_seconds);
      const Ticks server1 = read_ticks(server.pid()), client1 = read_ticks(client.pid());
      run.values["seconds"] = window.seconds();
      run.values["clk_tck"] = static_cast<double>(sysconf(_SC_CLK_TCK));
      run.values["server_ticks"] = static_cast<double>(server1.total - server0.total);
      run.values["client_ticks"] = static_cast<double>(client1.total - client0.total);
      run.values["server_threads"] = static_cast<double>(server1.threads.size());
      run.values["client_threads"] = static_cast<double>(client1.threads.size());
      run.notes["server_busy_threads"] = busy_threads(server0, server1);
      run.notes["client_busy_threads"] = busy_threads(client0, client1);
    }
  }
  client.stop(20000);
  server.stop(20000);
  return runs;
}

// ---------------------------------------------------------------------------
// The suite

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string json_string(const std::string &s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) < 0x20) ch = ' ';
    out += ch;
  }
  return out + "\"";
}

std::string json_values(const std::map<std::string, double> &values, const std::map<std::string, std::string> &notes) {
  std::string out = "{";
  char number[64];
  for (const auto &[k, v] : values) {
    std::snprintf(number, sizeof number, "%.6g", v);
    out += (out.size() > 1 ? ", " : "") + json_string(k) + ": " + number;
  }
  for (const auto &[k, v] : notes) out += (out.size() > 1 ? ", " : "") + json_string(k) + ": " + json_string(v);
  return out + "}";
}

std::string case_json(const Case &c, const Outcome &o) {
  std::map<std::string, std::vector<double>> columns;
  std::string runs;
  for (const Run &r : o.runs) {
    runs += (runs.empty() ? "" : ", ") + json_values(r.values, r.notes);
    for (const auto &[k, v] : r.values) columns[k].push_back(v);
  }
  std::map<std::string, double> medians;
  for (const auto &[k, v] : columns) medians[k] = median(v);
  std::string out = "{\"measure\": " + json_string(c.measure) + ", \"transport\": " + json_string(c.transport) +
                    ", \"conns\": " + std::to_string(c.conns) + ", \"runs\": [" + runs +
                    "], \"median\": " + json_values(medians, {});
  if (!o.error.empty()) out += ", \"error\": " + json_string(o.error);
  if (!o.skipped.empty()) out += ", \"skipped\": " + json_string(o.skipped);
  return out + "}";
}

int run_suite(const Settings &s) {
  std::vector<std::pair<Case, Outcome>> results;
  for (const std::string &measure : s.measures) {
    const bool idle = measure.rfind("idle", 0) == 0;
    const std::vector<int> counts = measure == "conns" ? s.conn_counts : std::vector<int>{idle ? s.idle_conns : 1};
    for (int n : counts) {
      const size_t first = results.size();
      for (const std::string &t : s.transports) results.push_back({Case{measure, t, n}, Outcome{}});
      // Repetition-major, so that load that comes and goes hits every
      // transport alike. conns repeats in windows of one pair of processes
      // (setting up 1,000 connections costs more than measuring them).
      const int windows = measure == "conns" ? s.repetitions : 1;
      const int reps = idle || measure == "conns" ? 1 : s.repetitions;
      for (int rep = 1; rep <= reps; ++rep) {
        for (size_t i = first; i < results.size(); ++i) {
          auto &[c, o] = results[i];
          if (rep == 1) o.skipped = shm_shortfall(c);
          if (!o.skipped.empty()) {
            if (rep == 1) std::printf("bench_sockets: %s: skipped: %s\n", c.name().c_str(), o.skipped.c_str());
            continue;
          }
          const std::vector<Run> runs = run_pair(c, s, windows);
          for (size_t w = 0; w < runs.size(); ++w) {
            const Run &r = runs[w];
            if (r.error.empty()) o.runs.push_back(r);
            else if (o.error.empty()) o.error = r.error;
            std::printf("bench_sockets: %s run %zu/%d: %s\n", c.name().c_str(), rep + w, std::max(reps, windows),
                        r.error.empty() ? json_values(r.values, r.notes).c_str() : ("FAILED: " + r.error).c_str());
          }
          std::fflush(stdout);
        }
      }
    }
  }
  int status = 0;
  std::string cases;
  for (const auto &[c, o] : results) {
    cases += (cases.empty() ? "\n  " : ",\n  ") + case_json(c, o);
    if (!o.error.empty()) status = 1;
  }
  char head[256];
  std::snprintf(head, sizeof head, "{\"clk_tck\": %ld, \"cpus\": %ld, \"repetitions\": %d, \"idle_seconds\": %g,\n",
                sysconf(_SC_CLK_TCK), sysconf(_SC_NPROCESSORS_ONLN), s.repetitions, s.idle_seconds);
  const std::string json = std::string(head) + " \"cases\": [" + cases + "\n]}\n";
  if (!s.json_path.empty()) {
    std::ofstream f(s.json_path);
    f << json;
    if (!f) {
      std::fprintf(stderr, "bench_sockets: cannot write %s\n", s.json_path.c_str());
      return 1;
    }
  } else {
    std::fputs(json.c_str(), stdout);
  }
  return status;
}

Settings parse_suite(int argc, char **argv) {
  Settings s;
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage("missing value for " + arg);
      return argv[++i];
    };
    if (arg == "--quick") {
      s.repetitions = 1, s.rtt_seconds = 0.3, s.wake_samples = 50, s.conn_seconds = 1;
      s.idle_seconds = 2, s.idle_settle_seconds = 0.5;
    } else if (arg == "--smoke") {
      s.repetitions = 1, s.rtt_seconds = 0.1, s.wake_samples = 10, s.conn_counts = {10}, s.conn_seconds = 0.3;
      s.idle_conns = 10, s.idle_seconds = 0.5, s.idle_settle_seconds = 0.2;
    } else if (arg == "--repetitions") {
      s.repetitions = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--measures") {
      s.measures = split(value());
    } else if (arg == "--transports") {
      s.transports = split(value());
    } else if (arg == "--json") {
      s.json_path = value();
    } else {
      usage("unknown option " + arg);
    }
  }
  return s;
}

int run_role(int argc, char **argv) {
  if (argc < 3) usage("a role needs a measure");
  const std::string role = argv[1];
  RoleOptions o;
  o.measure = argv[2];
  std::string transport;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--transport") transport = value;
    else if (arg == "--port") o.port = std::atoi(value.c_str());
    else if (arg == "--conns") o.conns = std::max(1, std::atoi(value.c_str()));
    else if (arg == "--seconds") o.seconds = std::atof(value.c_str());
    else if (arg == "--samples") o.samples = std::max(1, std::atoi(value.c_str()));
    else if (arg == "--windows") o.windows = std::max(1, std::atoi(value.c_str()));
    else usage("unknown option " + arg);
  }
  if (transport.empty() || o.port <= 0) usage("a role needs --transport and --port");
  if (transport == "kernel") {
    return role == "serve" ? serve<gpusock::test::KernelSockets>(o) : client<gpusock::test::KernelSockets>(o);
  }
  setenv("GPUSOCK_TRANSPORT", transport.c_str(), 1);  // read at the first gs_ call
  return role == "serve" ? serve<gpusock::test::GsSockets>(o) : client<gpusock::test::GsSockets>(o);
}

}  // namespace

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  // 1,000 connections on each side, plus what a transport opens per socket.
  gpusock::test::raise_fd_limit();
  if (argc < 2) usage("no mode");
  const std::string mode = argv[1];
  if (mode == "suite") return run_suite(parse_suite(argc, argv));
  if (mode == "serve" || mode == "client") return run_role(argc, argv);
  usage("unknown mode " + mode);
}
