// fork and exec of a process with gpusock sockets (fork.h).
#include "preload/fork.h"
#include "wire/log.h"

#include "preload/config.h"
#include "preload/epoll_table.h"
#include "preload/fd_table.h"
#include "preload/library.h"
#include "preload/listeners.h"
#include "preload/relay.h"
#include "preload/relay_name.h"
#include "preload/routing.h"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace gpusock::preload {

namespace {

std::atomic<pid_t> g_process{0};  // whose tables these are

// One gpusock socket as a forked child inherits it: all its fds, and what
// stands on those numbers in the child.
struct Inherited {
  std::shared_ptr<SockInfo> info;
  std::vector<std::pair<int, bool>> fds;  // number, close-on-exec
  bool listening = false;
  bool nonblocking = false;
  bool set_aside = false;  // a listener the parent sets aside before the fork (listeners.h)
  int c = -1;              // the child's kernel socket (a listener's placeholder), dup3()ed onto fds in the child
  int r = -1;              // a relay's end in the parent (relay.h)
  int g = -1;              // a relay's own gpusock fd of the socket (kInternal)
};
using Sockets = std::map<SockInfo *, Inherited>;

// Every gpusock socket of the process, with its fds.
Sockets inherited_sockets() {
  const Real &R = real();
  Sockets socks;
  for (auto &[fd, info] : all_gs_fds()) {
    Inherited &gr = socks[info.get()];
    gr.info = info;
    const int fdfl = R.fcntl(fd, F_GETFD);
    gr.fds.push_back({fd, fdfl >= 0 && (fdfl & FD_CLOEXEC)});
    gr.listening = info->listening.load();
    Inside guard;
    gr.nonblocking = gs().fcntl(fd, F_GETFL) & O_NONBLOCK;
  }
  return socks;
}

// The child's end answers getsockname/getpeername with the connection's
// addresses, as the kernel socket it stands for would (relay_name.h).
void name_child_end(int fd, int c) {
  ConnectionNames names;
  names.local_len = names.peer_len = sizeof(sockaddr_storage);
  if (gs().getsockname(fd, reinterpret_cast<sockaddr *>(&names.local), &names.local_len) < 0 ||
      gs().getpeername(fd, reinterpret_cast<sockaddr *>(&names.peer), &names.peer_len) < 0 || !name_relay_end(c, names))
    log::write(log::kInfo, "shim",
               "fork: the child's end of fd %d does not carry the connection's addresses (it reads as AF_UNIX)", fd);
}

// What the child gets for each socket: a listener a placeholder kernel socket
// (it is dormant there, listeners.h), a connection its end of a relay's
// socketpair.
void make_child_ends(Sockets &socks) {
  const Real &R = real();
  for (auto &[key, gr] : socks) {
    const int first = gr.fds.front().first;
    if (gr.listening) {
      std::vector<int> numbers;
      for (auto &[fd, cloexec] : gr.fds) numbers.push_back(fd);
      gr.set_aside = prepare_listener_fork(numbers, gr.info);
      const int domain = gr.info->spec ? gr.info->spec->domain : AF_INET;
      gr.c = R.socket(domain, SOCK_STREAM | SOCK_CLOEXEC | (gr.nonblocking ? SOCK_NONBLOCK : 0), 0);
      continue;
    }
    int sv[2];
    if (R.socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) continue;
    gr.r = sv[0];
    gr.c = sv[1];
    R.fcntl(gr.r, F_SETFL, O_NONBLOCK);
    if (gr.nonblocking) R.fcntl(gr.c, F_SETFL, O_NONBLOCK);
    Inside guard;
    gr.g = gs().dup(first);
    if (gr.g >= 0) {
      gs().fcntl(gr.g, F_SETFD, FD_CLOEXEC);
      set_kind(gr.g, kInternal);
      name_child_end(first, gr.c);
    } else {
      R.close(gr.r);
      R.close(gr.c);
      gr.r = gr.c = -1;
    }
  }
}

// In the child: its ends replace the sockets' fds, and the shim's tables forget
// what is the parent's.
void child_after_fork(const Sockets &socks, const std::vector<int> &old_relay_fds) {
  const Real &R = real();
  for (auto &[key, gr] : socks) {
    if (gr.c < 0 || gr.listening) continue;
    for (auto &[fd, cloexec] : gr.fds) R.dup3(gr.c, fd, cloexec ? O_CLOEXEC : 0);
    R.close(gr.c);
    if (gr.r >= 0) R.close(gr.r);
    if (gr.g >= 0) R.close(gr.g);
  }
  for (int fd : old_relay_fds) R.close(fd);
  forget_all_gs_fds_in_child();
  dormant_after_fork_child();
  for (auto &[key, gr] : socks) {
    if (gr.c < 0 || !gr.listening) continue;
    if (gr.info->spec) child_listener_dormant(gr.fds, gr.c, gr.info->spec);
    else
      for (auto &[fd, cloexec] : gr.fds) R.dup3(gr.c, fd, cloexec ? O_CLOEXEC : 0);
    R.close(gr.c);
  }
  transport_fds_cloexec_in_child();  // the parent's libfabric sockets do not follow an exec
  epoll_after_fork_child();
  relay_after_fork_child();
}

// In the parent (pid < 0: the fork failed): the relays start, or are undone.
// Caller holds relay_mutex().
void parent_after_fork(const Sockets &socks, pid_t pid) {
  const Real &R = real();
  for (auto &[key, gr] : socks) {
    if (gr.c >= 0) R.close(gr.c);
    if (gr.r < 0) continue;
    if (pid < 0) {
      R.close(gr.r);
      set_kind(gr.g, kKernel);
      Inside guard;
      gs().close(gr.g);
      continue;
    }
    std::vector<int> parent_fds;
    for (auto &[fd, cloexec] : gr.fds) parent_fds.push_back(fd);
    add_relay_locked(gr.r, gr.g, gr.info, std::move(parent_fds));
    log::write(log::kDebug, "shim", "fork: relaying fd %d to child %d", gr.fds.front().first, static_cast<int>(pid));
  }
  if (pid > 0) run_relays_locked();
}

}  // namespace

pid_t fork_with_relays(const std::function<pid_t()> &make_child) {
  Sockets socks = inherited_sockets();
  make_child_ends(socks);
  // A listener the parent sets aside stops listening before the fork, not
  // after it: a client that connected in between would reach a listener about
  // to close (its connection reset, or its handshake never answered where the
  // processes cannot share a port) instead of being refused or queued.
  for (auto &[key, gr] : socks)
    if (gr.set_aside) set_listener_aside(gr.fds, gr.info->spec, gr.nonblocking);
  // Hold the shim's tables across the fork so the child's copies are whole.
  std::unique_lock relay_lock(relay_mutex());
  std::unique_lock fd_lock(fd_table_mutex());
  std::unique_lock epoll_lock(epoll_table_mutex());
  const std::vector<int> old_relay_fds = relay_fds_locked();
  const pid_t pid = make_child();
  const int fork_errno = errno;
  epoll_lock.unlock();
  fd_lock.unlock();
  if (pid == 0) {
    note_own_process();
    relay_lock.unlock();
    child_after_fork(socks, old_relay_fds);
    return 0;
  }
  parent_after_fork(socks, pid);
  errno = fork_errno;
  return pid;
}

void note_own_process() { g_process.store(getpid()); }

Tables adopt_if_cloned() {
  pid_t owner = g_process.load(std::memory_order_relaxed);
  const pid_t self = getpid();  // the kernel's answer: glibc caches no pid
  if (owner == self) return Tables::kOwn;
  if (real().syscall(SYS_kcmp, self, owner, KCMP_VM, 0, 0) == 0) return Tables::kVforkChild;
  if (!g_process.compare_exchange_strong(owner, self)) return Tables::kOwn;
  // Locks a thread of the parent held stay held here; nobody else holds one yet.
  new (&fd_table_mutex()) std::mutex();
  new (&epoll_table_mutex()) std::mutex();
  new (&relay_mutex()) std::mutex();
  Sockets socks = inherited_sockets();
  for (auto &[key, gr] : socks) {
    const int domain = gr.info->spec ? gr.info->spec->domain : AF_INET;
    gr.c = real().socket(domain, SOCK_STREAM | SOCK_CLOEXEC | (gr.nonblocking ? SOCK_NONBLOCK : 0), 0);
  }
  child_after_fork(socks, relay_fds_locked());
  log::write(log::kInfo, "shim",
             "process made by a clone the shim did not see: %zu inherited gpusock socket(s) left to the parent",
             socks.size());
  return Tables::kOwn;
}

void before_exec() {
  auto fds = all_gs_fds();
  if (fds.empty()) return;
  log::write(log::kInfo, "shim", "exec: closing %zu gpusock socket fd(s) in order (they cannot survive exec)",
             fds.size());
  for (auto &[fd, info] : fds) {
    linger l{1, 5};
    {
      Inside guard;
      gs().setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close_fd(fd);
  }
}

}  // namespace gpusock::preload
