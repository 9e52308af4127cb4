// What a process holds, counted from /proc and /dev/shm: open fds, threads,
// /dev/shm entries (every process's, shm regions and bells) and resident
// memory. Soak and fault tests take a baseline, run, and check that the
// counts came back to it (closes finish in the background, so they wait).
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "test-support/timing.h"

namespace gpusock::test {

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
  int shm = 0;      // entries in /dev/shm
  long rss_kib = 0;
  std::string fd_list;  // what those fds are, from the same listing

  static Resources now() {
    Resources r;
    r.fd_list = fd_targets(&r.fds);
    r.threads = count_entries("/proc/self/task");
    r.shm = count_entries("/dev/shm");
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
