#include "wire/fabric/shm_names.h"

#include "wire/fabric/shm_hints.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>

namespace gpusock::wire::fabric::shm {
namespace {

constexpr char kShmDir[] = "/dev/shm";  // where glibc's shm_open puts its objects
constexpr char kEndpointPrefix[] = "gpusock-ep-";
constexpr char kRendezvousPrefix[] = "gpusock-";
// A rendezvous file with no content yet may be a listener between creating and
// locking it; only this old is it left over.
constexpr time_t kUnfinishedRendezvousS = 10;
// claim_rendezvous: how long a lock held by a dead listener's name (a sweeper
// at work, or a descendant holding the descriptor) is waited out.
constexpr int kClaimRetries = 20;
constexpr useconds_t kClaimRetryUs = 500;

std::atomic<uint64_t> g_endpoint_seq{0};
std::atomic<pid_t> g_self_pid{0};
std::atomic<uint64_t> g_self_start{0};
std::atomic<uint32_t> g_self_tag{0};
std::atomic<pid_t> g_swept_pid{0};

uint32_t random_u32() {
  uint32_t value = 0;
  if (getrandom(&value, sizeof(value), GRND_NONBLOCK) != sizeof(value)) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    value = static_cast<uint32_t>(ts.tv_nsec) ^ (static_cast<uint32_t>(getpid()) * 0x9e3779b9u);
  }
  return value;
}

// Parses an unsigned number of `base` at the front of `s` up to '-' or the end.
bool take_number(std::string_view *s, int base, uint64_t *out) {
  size_t i = 0;
  uint64_t value = 0;
  for (; i < s->size() && (*s)[i] != '-'; ++i) {
    const char c = (*s)[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    if (value > (UINT64_MAX - static_cast<uint64_t>(digit)) / static_cast<uint64_t>(base)) return false;
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
  }
  if (i == 0) return false;
  *out = value;
  s->remove_prefix(i < s->size() ? i + 1 : i);
  return true;
}

bool valid_content(const Rendezvous &rv) {
  return rv.magic == kRendezvousMagic && rv.version == kRendezvousVersion && rv.pid > 0 &&
         memchr(rv.name, '\0', sizeof(rv.name)) != nullptr;
}

bool read_content(int fd, Rendezvous *out) {
  return pread(fd, out, sizeof(*out), 0) == static_cast<ssize_t>(sizeof(*out)) && valid_content(*out);
}

// The listener a valid rendezvous names, as a process.
bool content_owner(const Rendezvous &rv, ProcessId *owner) {
  if (!parse_endpoint_name(rv.name, owner) || owner->pid != rv.pid) {
    owner->pid = rv.pid;
    owner->start = 0;
  }
  return true;
}

bool content_owner_alive(const Rendezvous &rv) {
  ProcessId owner;
  content_owner(rv, &owner);
  return process_alive(owner);
}

std::string shm_path(const char *dir, const std::string &name) { return std::string(dir) + "/" + name; }

// Does `name` still name the file open as `fd`?
bool still_named(const char *dir, const std::string &name, int fd) {
  struct stat by_fd {
  }, by_name{};
  if (fstat(fd, &by_fd) != 0 || stat(shm_path(dir, name).c_str(), &by_name) != 0) return false;
  return by_fd.st_dev == by_name.st_dev && by_fd.st_ino == by_name.st_ino;
}

bool try_lock(int fd) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

bool locked_by_someone(int fd) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  return fcntl(fd, F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK;
}

std::string describe_owner(const std::string &name, const Rendezvous &rv) {
  return "fabric:shm: " + name + " is in use by process " + std::to_string(rv.pid) + " (listener endpoint " + rv.name +
         ")";
}

}  // namespace

int process_start(pid_t pid, uint64_t *start) {
  if (pid <= 0) return 0;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT && errno != ESRCH) return -1;
    // No /proc entry: gone, unless /proc is not what we think it is.
    return kill(pid, 0) != 0 && errno == ESRCH ? 0 : -1;
  }
  char text[1024];
  const ssize_t n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n <= 0) return n == 0 ? 0 : (errno == ESRCH ? 0 : -1);  // ESRCH: it died while we looked
  text[n] = '\0';
  // "pid (comm) state ppid ..."; comm may hold spaces and ')'. starttime is
  // field 22; the state is field 3, the first after the last ')'.
  char *p = std::strrchr(text, ')');
  if (p == nullptr) return -1;
  ++p;
  int field = 2;
  char state = '\0';
  uint64_t value = 0;
  while (*p != '\0') {
    while (*p == ' ') ++p;
    if (*p == '\0') break;
    ++field;
    char *end = p;
    while (*end != ' ' && *end != '\0') ++end;
    if (field == 3) state = *p;
    if (field == 22) {
      value = std::strtoull(p, nullptr, 10);
      break;
    }
    p = end;
  }
  if (field != 22) return -1;
  if (state == 'Z' || state == 'X') return 0;  // killed, not yet reaped: as good as gone
  *start = value;
  return 1;
}

ProcessId self() {
  const pid_t pid = getpid();
  if (g_self_pid.load(std::memory_order_acquire) != pid) {
    uint64_t start = 0;
    if (process_start(pid, &start) != 1) start = 0;
    g_self_start.store(start, std::memory_order_relaxed);
    g_self_tag.store(random_u32(), std::memory_order_relaxed);
    g_self_pid.store(pid, std::memory_order_release);
  }
  ProcessId id;
  id.pid = pid;
  id.start = g_self_start.load(std::memory_order_relaxed);
  return id;
}

bool process_alive(const ProcessId &id) {
  if (id.pid <= 0) return false;
  if (id.pid == getpid()) return id.start == 0 || id.start == self().start;
  uint64_t start = 0;
  const int found = process_start(id.pid, &start);
  if (found == 0) return false;
  if (found < 0 || id.start == 0) return true;  // unknown, or an old name: the pid alone says alive
  return start == id.start;
}

std::string new_endpoint_name(uint64_t *seq_out) {
  const ProcessId me = self();
  const uint64_t seq = g_endpoint_seq.fetch_add(1, std::memory_order_relaxed);
  if (seq_out != nullptr) *seq_out = seq;
  char name[kNameMax];
  std::snprintf(name, sizeof(name), "%s%d-%llu-%08x-%llu", kEndpointPrefix, static_cast<int>(me.pid),
                static_cast<unsigned long long>(me.start), g_self_tag.load(std::memory_order_relaxed),
                static_cast<unsigned long long>(seq));
  return name;
}

bool parse_endpoint_name(std::string_view name, ProcessId *owner) {
  constexpr size_t prefix_len = sizeof(kEndpointPrefix) - 1;
  if (name.substr(0, prefix_len) != kEndpointPrefix) return false;
  name.remove_prefix(prefix_len);
  uint64_t numbers[4];
  int count = 0;
  while (!name.empty()) {
    if (count == 4 || !take_number(&name, count == 2 ? 16 : 10, &numbers[count])) return false;
    ++count;
  }
  if ((count != 2 && count != 4) || numbers[0] == 0 || numbers[0] > INT32_MAX) return false;
  if (count == 2) {  // gpusock-ep-<pid>-<seq>: before start times were part of the name
    owner->pid = static_cast<pid_t>(numbers[0]);
    owner->start = 0;
    return true;
  }
  owner->pid = static_cast<pid_t>(numbers[0]);
  owner->start = numbers[1];
  return true;
}

bool endpoint_owner_alive(std::string_view name) {
  ProcessId owner;
  return !parse_endpoint_name(name, &owner) || process_alive(owner);
}

namespace {

// The endpoint name a bell or hint board file is named after, or "".
std::string_view endpoint_file_base(std::string_view file) {
  for (std::string_view suffix : {std::string_view(kBellSuffix), std::string_view(kHintsSuffix)})
    if (file.size() > suffix.size() && file.substr(file.size() - suffix.size()) == suffix)
      return file.substr(0, file.size() - suffix.size());
  return {};
}

}  // namespace

std::string bell_path(const std::string &endpoint_name) { return shm_path(kShmDir, endpoint_name + kBellSuffix); }

void unlink_endpoint_files(const std::string &name) {
  shm_unlink(name.c_str());
  unlink(bell_path(name).c_str());
  // Its process's hint board: a name of the same process (all but the
  // sequence number) with the board's suffix.
  const size_t dash = name.rfind('-');
  if (dash == std::string::npos) return;
  const std::string_view process = std::string_view(name).substr(0, dash + 1);
  DIR *d = opendir(kShmDir);
  if (d == nullptr) return;
  while (dirent *entry = readdir(d)) {
    const std::string_view file = entry->d_name;
    if (file.starts_with(process) && file.ends_with(kHintsSuffix)) unlink(shm_path(kShmDir, std::string(file)).c_str());
  }
  closedir(d);
}

std::string rendezvous_name(const std::string &ip, uint16_t port) {
  return kRendezvousPrefix + ip + "-" + std::to_string(port);
}

bool read_rendezvous(const std::string &name, Rendezvous *out, uid_t *owner) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  // Locked (a listener holds it), valid, and the listener's process alive (a
  // lock can outlive its listener in a descendant that inherited the fd).
  bool ok = locked_by_someone(fd) && read_content(fd, out) && content_owner_alive(*out);
  struct stat st {};
  if (ok && owner != nullptr) {
    ok = fstat(fd, &st) == 0;
    *owner = st.st_uid;
  }
  close(fd);
  return ok;
}

int claim_rendezvous(const std::string &name, int *fd_out, std::string *detail) {
  for (int attempt = 0;; ++attempt) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, S_IRUSR | S_IWUSR);
    if (fd < 0) {
      if (errno == EACCES) {  // another user's listener (or its leftover): not ours to take
        if (detail != nullptr) *detail = "fabric:shm: " + name + " belongs to another user";
        return -EADDRINUSE;
      }
      return -errno;
    }
    if (try_lock(fd)) {
      if (!still_named(kShmDir, name, fd)) {
        // A sweeper or another listener removed this file meanwhile: start over.
        close(fd);
        if (attempt < kClaimRetries) continue;
        if (detail != nullptr) *detail = "fabric:shm: " + name + " keeps changing";
        return -EADDRINUSE;
      }
      // A rendezvous left by a killed listener: its endpoint region went with
      // it unremoved (shm unlinks only on fi_close); take that away too.
      Rendezvous old{};
      if (read_content(fd, &old) && !content_owner_alive(old) &&
          std::strncmp(old.name, kEndpointPrefix, sizeof(kEndpointPrefix) - 1) == 0) {
        unlink_endpoint_files(old.name);
      }
      // Empty until the listener writes itself in: whoever looks meanwhile sees
      // a locked file with no listener yet ("being claimed").
      if (ftruncate(fd, 0) != 0) {
        const int err = errno;
        close(fd);
        return -err;
      }
      *fd_out = fd;
      return 0;
    }
    // Somebody holds the lock.
    Rendezvous current{};
    const bool valid = read_content(fd, &current);
    if (valid && content_owner_alive(current)) {
      close(fd);
      if (detail != nullptr) *detail = describe_owner(name, current);
      return -EADDRINUSE;
    }
    if (attempt < kClaimRetries) {  // a sweeper for a moment, or a listener being made
      close(fd);
      usleep(kClaimRetryUs);
      continue;
    }
    if (valid) {
      // The listener is dead but the lock lives on in a process that inherited
      // the descriptor (forked without exec). Nobody can connect through it:
      // replace the file (the holder keeps a lock on an unlinked one).
      if (still_named(kShmDir, name, fd)) shm_unlink(name.c_str());
      close(fd);
      if (attempt < 2 * kClaimRetries) continue;
    } else {
      close(fd);
    }
    if (detail != nullptr) *detail = "fabric:shm: " + name + " is being claimed by another listener";
    return -EADDRINUSE;
  }
}

int sweep_stale_files() {
  DIR *d = opendir(kShmDir);
  if (d == nullptr) return 0;
  int removed = 0;
  std::map<std::pair<pid_t, uint64_t>, bool> alive;  // verdicts of this sweep
  auto is_alive = [&](const ProcessId &id) {
    auto key = std::make_pair(id.pid, id.start);
    auto it = alive.find(key);
    if (it == alive.end()) it = alive.emplace(key, process_alive(id)).first;
    return it->second;
  };
  const time_t now = time(nullptr);
  while (dirent *entry = readdir(d)) {
    const std::string name = entry->d_name;
    if (name.rfind(kRendezvousPrefix, 0) != 0) continue;
    ProcessId owner;
    if (parse_endpoint_name(name, &owner)) {
      // A region: stale once its owner is dead (a dead process cannot come back).
      if (!is_alive(owner) && shm_unlink(name.c_str()) == 0) ++removed;
      continue;
    }
    if (const std::string_view base = endpoint_file_base(name); !base.empty() && parse_endpoint_name(base, &owner)) {
      // A bell or a hint board: the same.
      if (!is_alive(owner) && unlink(shm_path(kShmDir, name).c_str()) == 0) ++removed;
      continue;
    }
    if (name.rfind(kEndpointPrefix, 0) == 0) continue;  // not a name we make
    const int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) continue;  // gone meanwhile, or another user's
    Rendezvous rv{};
    const bool valid = read_content(fd, &rv);
    ProcessId listener;
    if (valid) content_owner(rv, &listener);
    bool stale = false;
    if (try_lock(fd)) {
      // Nobody holds it: stale, unless a listener just created it and is about
      // to lock it (then it is empty and young).
      struct stat st {};
      stale = valid || (fstat(fd, &st) == 0 && now - st.st_mtime > kUnfinishedRendezvousS);
    } else {
      // Held by a process that inherited it from a dead listener.
      stale = valid && !is_alive(listener);
    }
    if (stale && still_named(kShmDir, name, fd) && shm_unlink(name.c_str()) == 0) ++removed;
    close(fd);  // releases our lock, if we took it
  }
  closedir(d);
  return removed;
}

void sweep_stale_files_once() {
  const pid_t pid = getpid();
  if (g_swept_pid.exchange(pid, std::memory_order_acq_rel) == pid) return;
  sweep_stale_files();
}

}  // namespace gpusock::wire::fabric::shm
