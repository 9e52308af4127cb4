// What a process holds, counted from /proc and /dev/shm: open fds, threads,
// its own /dev/shm entries (shm regions, bells, hint boards, rendezvous files
// of its listeners) and resident memory. Soak and fault tests take a baseline, run, and check that the
// counts came back to it (closes finish in the background, so they wait).
#pragma once

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "test-support/timing.h"

namespace gpusock::test {

// Lifts this process's soft limit on open descriptors to the hard one: tests
// and benchmarks with hundreds of connections (fabric:tcp takes several
// descriptors a connection) must not stop at a shell's default of 1,024.
inline void raise_fd_limit() {
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
}

// CPU time of a process or thread from a /proc stat file, in clock ticks
// (proc(5) fields 14 and 15), and its comm.
struct StatTicks {
  std::string comm;
  long utime = 0, stime = 0;
};
inline bool read_stat_ticks(const std::string &path, StatTicks *out) {
  std::ifstream f(path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos) return false;
  out->comm = text.substr(open + 1, close - open - 1);
  std::istringstream rest(text.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) out->utime = std::atol(field.c_str());
    if (i == 15) out->stime = std::atol(field.c_str());
  }
  return true;
}

// Every thread of process `pid` ("self" for this one): its id and ticks.
struct ThreadTicks : StatTicks {
  long tid = 0;
};
inline std::vector<ThreadTicks> thread_ticks(const std::string &pid = "self") {
  std::vector<ThreadTicks> out;
  const std::string dir = "/proc/" + pid + "/task/";
  DIR *tasks = opendir(dir.c_str());
  if (!tasks) return out;
  while (const dirent *e = readdir(tasks)) {
    if (e->d_name[0] == '.') continue;
    ThreadTicks t;
    t.tid = std::atol(e->d_name);
    if (read_stat_ticks(dir + e->d_name + "/stat", &t)) out.push_back(std::move(t));
  }
  closedir(tasks);
  return out;
}

// Entries of a folder, "." and ".." not counted; -1 if it cannot be read.
inline int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  while (const dirent *e = readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) ++n;
  closedir(d);
  return n;
}

// The /dev/shm entries of this process: those named after one of its endpoints
// (gpusock-ep-<pid>-..., and shm's own files derived from such a name) and
// rendezvous files whose content names one. /dev/shm is shared with every test
// that runs beside this one, so only what this process made is counted.
inline int count_own_shm_entries() {
  const std::string own = "gpusock-ep-" + std::to_string(getpid()) + "-";
  DIR *d = opendir("/dev/shm");
  if (!d) return -1;
  int n = 0;
  while (const dirent *e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(own, 0) == 0) {
      ++n;
    } else if (name.rfind("gpusock-", 0) == 0 && name.rfind("gpusock-ep-", 0) != 0) {
      std::ifstream f("/dev/shm/" + name);
      char head[512] = {};
      f.read(head, sizeof head - 1);
      if (std::string(head, static_cast<size_t>(f.gcount())).find(own) != std::string::npos) ++n;
    }
  }
  closedir(d);
  return n;
}

// A line "Name:  value kB" of /proc/self/status, as a number; -1 if absent.
inline long proc_status_value(const char *name) {
  FILE *f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long value = -1;
  const size_t len = std::strlen(name);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, name, len) == 0 && line[len] == ':') {
      value = std::strtol(line + len + 1, nullptr, 10);
      break;
    }
  std::fclose(f);
  return value;
}

// This process's open fds and what each is ("7=socket:[1234] 8=anon_inode:[eventfd]"),
// so that a count that did not come back names what was left; their number
// (the listing's own dir fd not counted) in *count, -1 if unreadable.
inline std::string fd_targets(int *count) {
  std::string out;
  *count = -1;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return out;
  const int own = dirfd(d);
  *count = 0;
  while (const dirent *e = readdir(d)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
    char target[256];
    const ssize_t n = readlinkat(own, e->d_name, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    out += std::string(out.empty() ? "" : " ") + e->d_name + "=" + target;
    ++*count;
  }
  closedir(d);
  return out;
}

struct Resources {
  int fds = 0;      // open fds of this process (the listing's own dir fd excluded)
  int threads = 0;  // threads of this process
  int shm = 0;      // this process's entries in /dev/shm
  long rss_kib = 0;
  std::string fd_list;  // what those fds are, from the same listing

  static Resources now() {
    Resources r;
    r.fd_list = fd_targets(&r.fds);
    r.threads = count_entries("/proc/self/task");
    r.shm = count_own_shm_entries();
    r.rss_kib = proc_status_value("VmRSS");
    return r;
  }
  // fds, threads and /dev/shm entries no more than in `base` (memory is not
  // compared: allocators keep freed memory).
  bool within(const Resources &base) const { return fds <= base.fds && threads <= base.threads && shm <= base.shm; }
  std::string describe() const {
    return std::to_string(fds) + " fds, " + std::to_string(threads) + " threads, " + std::to_string(shm) +
           " /dev/shm entries, " + std::to_string(rss_kib / 1024) + " MiB resident (fds: " + fd_list + ")";
  }
};

// Connections a test makes before it takes its baseline: enough that the
// process's one-time helpers are in it (the engine's thread, the transport,
// and over fabric:shm the endpoints opened ahead, from the fourth on).
inline constexpr int kWarmUpConnections = 6;

// The counts once they stopped moving (the same three samples in a row,
// 100 ms apart; at most `seconds`): a baseline taken while a helper thread
// still opens what it keeps would be too low.
inline Resources settled_resources(double seconds = 5) {
  const Deadline deadline(seconds);
  Resources last = Resources::now();
  for (int same = 0; same < 2 && !deadline.passed();) {
    usleep(100000);
    Resources next = Resources::now();
    same = next.fds == last.fds && next.threads == last.threads && next.shm == last.shm ? same + 1 : 0;
    last = std::move(next);
  }
  return last;
}

// Waits up to `seconds` for the counts to come back within `base`; the last
// sample goes to *last.
inline bool back_to_baseline(const Resources &base, double seconds, Resources *last) {
  const Deadline deadline(seconds);
  for (;;) {
    *last = Resources::now();
    if (last->within(base) || deadline.passed()) return last->within(base);
    usleep(20000);
  }
}

}  // namespace gpusock::test
