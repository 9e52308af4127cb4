// Listeners shared by the processes of a forked server (listeners.h).
#include "preload/listeners.h"
#include "wire/log.h"

#include "preload/config.h"
#include "preload/epoll_table.h"
#include "preload/library.h"
#include "preload/routing.h"
#include "preload/signals.h"
#include "preload/wait.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <time.h>

#include <cstring>
#include <new>

namespace gpusock::preload {

namespace {

thread_local ListenSpec *t_arm = nullptr;

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

uint16_t spec_port(const ListenSpec &spec) {
  uint16_t port = 0;
  port_of(reinterpret_cast<const sockaddr *>(&spec.addr), spec.addr_len, &port);
  return port;
}

// IPV6_V6ONLY as the application set it before listen (-1: not set).
int recorded_v6only(const std::vector<Pending::Opt> &opts) {
  int v = -1;
  for (const auto &o : opts)
    if (o.level == IPPROTO_IPV6 && o.name == IPV6_V6ONLY && o.value.size() >= sizeof(int)) {
      std::memcpy(&v, o.value.data(), sizeof v);
      v = v != 0;
    }
  return v;
}

// The application's receive activity on the listener's fds (waits, accepts).
uint32_t touches(const std::vector<int> &fds) {
  uint32_t sum = 0;
  for (int fd : fds)
    if (FdSlot *s = slot(fd)) sum += s->rtouch.load(std::memory_order_relaxed);
  return sum;
}

// fabric:tcp: the kernel listening socket libfabric made for this listener
// (one of the transport's fds, listening, on the same port): duplicated so
// that it outlives this process's listener and is inherited by children.
int find_anchor(const ListenSpec &spec) {
  const Real &R = real();
  const uint16_t want = spec_port(spec);
  int anchor = -1;
  for_each_slot(0, ~0u, [&](int fd, FdSlot &s) {
    if (anchor >= 0 || s.kind.load() != kTransport) return;
    int on = 0;
    socklen_t ol = sizeof on;
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    uint16_t port = 0;
    if (R.getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &on, &ol) < 0 || !on) return;
    if (R.getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl) < 0 || ss.ss_family != spec.domain) return;
    if (port_of(reinterpret_cast<sockaddr *>(&ss), sl, &port) < 0 || port != want) return;
    anchor = R.fcntl(fd, F_DUPFD_CLOEXEC, 0);
  });
  return anchor;
}

// Activation failed: not now; the log says why once; try again after kRetryMs.
int not_now(int fd, ListenSpec &spec, int err) {
  spec.retry_ns = now_ns() + kRetryMs * 1000000;
  if (!spec.told_busy) {
    spec.told_busy = true;
    const std::string where = addr_text(reinterpret_cast<sockaddr *>(&spec.addr), spec.addr_len);
    if (err == -EADDRINUSE)
      log::write(log::kWarn, "shim",
                 "fd %d: %s is held by another process of this program (%s cannot share a listening port between "
                 "processes): that process serves its connections; this one takes the port when it is free "
                 "(trying every %ld ms)",
                 fd, where.c_str(), transport_name(), kRetryMs);
    else
      log::write(log::kWarn, "shim", "fd %d: cannot listen on %s in this process: %s (%s); trying again every %ld ms",
                 fd, where.c_str(), gs().last_error(), strerror(-err), kRetryMs);
  }
  return 0;
}

}  // namespace

// Does the listener take requests only when asked (GS_ACCEPT_ON_DEMAND in
// force: the transport lets requests wait)?
bool requests_wait(int gs_fd) {
  int on = 0;
  socklen_t len = sizeof on;
  Inside guard;
  return gs().getsockopt(gs_fd, SOL_GPUSOCK, GS_ACCEPT_ON_DEMAND, &on, &len) == 0 && on;
}

void share_accepts(int gs_fd) {
  const int on = 1;
  gs().setsockopt(gs_fd, SOL_GPUSOCK, GS_ACCEPT_ON_DEMAND, &on, sizeof on);
}

// ---------------------------------------------------------------- marks

std::shared_ptr<ListenSpec> spec_for_listen(int fd) {
  auto info = sock_info(fd);
  if (!info) return nullptr;
  if (!info->spec) info->spec = std::make_shared<ListenSpec>();
  std::lock_guard lock(info->spec->mu);
  info->spec->v6only = recorded_v6only(info->spec->opts);
  return info->spec;
}

void note_listen_option(const std::shared_ptr<ListenSpec> &spec, int level, int name, const void *val, socklen_t len) {
  if (!spec || !val) return;
  std::lock_guard lock(spec->mu);
  spec->opts.push_back(
      {level, name, std::vector<char>(static_cast<const char *>(val), static_cast<const char *>(val) + len)});
  spec->v6only = recorded_v6only(spec->opts);
}

void note_listen(int fd, int backlog) {
  auto spec_ptr = spec_for_listen(fd);
  if (!spec_ptr) return;
  ListenSpec &spec = *spec_ptr;
  std::lock_guard lock(spec.mu);
  spec.addr_len = sizeof spec.addr;
  {
    Inside guard;
    gs().getsockname(fd, reinterpret_cast<sockaddr *>(&spec.addr), &spec.addr_len);
  }
  spec.domain = spec.addr.ss_family;
  spec.backlog = backlog;
  spec.touch_mark = touches({fd});
}

// ---------------------------------------------------------------- dormant listeners

int activate(int fd) {
  auto spec = dormant_spec(fd);
  if (!spec) return kind_of(fd) == kGs ? 1 : -EBADF;
  std::lock_guard lock(spec->mu);
  if (kind_of(fd) != kDormant) return kind_of(fd) == kGs ? 1 : -EBADF;  // another thread was first
  if (now_ns() < spec->retry_ns) return 0;
  const Real &R = real();
  const int fl = R.fcntl(fd, F_GETFL);
  const int tmp = new_gs_socket(spec->domain, fl >= 0 && (fl & O_NONBLOCK), spec->opts);
  if (tmp < 0) return not_now(fd, *spec, tmp);
  int r;
  {
    Inside guard;
    share_accepts(tmp);
    r = gs().bind(tmp, reinterpret_cast<sockaddr *>(&spec->addr), spec->addr_len);
    ListenArm arm(spec.get());
    if (r == 0) r = gs().listen(tmp, spec->backlog);
  }
  if (r < 0) {
    Inside guard;
    gs().close(tmp);
    return not_now(fd, *spec, r);
  }
  // Every fd of this listener in the process, each replaced in one step.
  auto info = std::make_shared<SockInfo>();
  info->listening = true;
  info->spec = spec;
  std::vector<int> fds;
  for (auto &[dfd, dspec] : all_dormant()) {
    if (dspec != spec) continue;
    const int fdfl = R.fcntl(dfd, F_GETFD);
    Inside guard;
    if (gs().dup3(tmp, dfd, fdfl >= 0 && (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) continue;
    attach_gs_fd(dfd, info);
    drop_dormant(dfd, /*keep_kind=*/true);
    note_timeouts(dfd, spec->opts);
    epoll_upgrade_fd(dfd);
    fds.push_back(dfd);
  }
  {
    Inside guard;
    gs().close(tmp);
  }
  spec->touch_mark = touches(fds);
  spec->told_busy = false;
  log::write(log::kInfo, "shim", "fd %d: listening on %s via gpusock (%s) in this process", fd,
             addr_text(reinterpret_cast<sockaddr *>(&spec->addr), spec->addr_len).c_str(), transport_name());
  return kind_of(fd) == kGs ? 1 : 0;
}

int activate_dormant(const pollfd *fds, size_t n) {
  int left = 0;
  for (size_t i = 0; i < n; ++i)
    if (fds[i].fd >= 0 && kind_of(fds[i].fd) == kDormant && activate(fds[i].fd) == 0) ++left;
  return left;
}

int accept_ready_dormant(int fd) {
  for (;;) {
    const int r = activate(fd);
    if (r == 1) return 0;
    if (r < 0) {
      errno = -r;
      return -1;
    }
    const int fl = real().fcntl(fd, F_GETFL);
    if (fl < 0) return -1;
    if (fl & O_NONBLOCK) {
      errno = EAGAIN;
      return -1;
    }
    const unsigned before = t_signals;
    const timespec ts{0, kRetryMs * 1000000};
    if (emulated_poll(nullptr, 0, &ts, nullptr) < 0 && errno == EINTR && !restart_after_eintr(before)) return -1;
  }
}

// ---------------------------------------------------------------- fork

bool listener_used_since_mark(int fd, const ListenSpec &spec) { return touches({fd}) != spec.touch_mark; }

bool prepare_listener_fork(const std::vector<int> &fds, const std::shared_ptr<SockInfo> &info) {
  if (!info || !info->spec) return false;
  ListenSpec &spec = *info->spec;
  std::lock_guard lock(spec.mu);
  if (spec.anchor < 0) spec.anchor = find_anchor(spec);
  bool used = touches(fds) != spec.touch_mark;
  for (int fd : fds) {
    if (FdSlot *s = slot(fd); s && s->waiters.load()) used = true;
    if (!used && epoll_has_fd(fd)) used = true;
  }
  // Connections already in its queue are this process's to accept. (Asked of
  // a listener only where its requests cannot wait (verbs): elsewhere it took
  // none unless the application asked, and asking here would take one at the
  // last moment.)
  if (!used && !requests_wait(fds.front())) {
    pollfd p{fds.front(), POLLIN, 0};
    Inside guard;
    if (gs().poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) used = true;
  }
  spec.touch_mark = touches(fds);
  return !used;
}

void child_listener_dormant(const std::vector<std::pair<int, bool>> &fds, int placeholder,
                            std::shared_ptr<ListenSpec> spec) {
  new (&spec->mu) std::mutex();  // another thread of the parent may have held it
  spec->retry_ns = 0;
  spec->told_busy = false;
  for (auto &[fd, cloexec] : fds) {
    if (FdSlot *s = slot(fd)) s->waiters.store(0);  // the parent's waits are not this process's
    real().dup3(placeholder, fd, cloexec ? O_CLOEXEC : 0);
    add_dormant(fd, spec);
  }
}

void dormant_after_fork_child() {
  for (auto &[fd, spec] : all_dormant()) new (&spec->mu) std::mutex();
}

void set_listener_aside(const std::vector<std::pair<int, bool>> &fds, std::shared_ptr<ListenSpec> spec,
                        bool nonblocking) {
  const Real &R = real();
  const int placeholder = R.socket(spec->domain, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (placeholder < 0) return;  // it stays active
  for (auto &[fd, cloexec] : fds) {
    release_gs_target(fd);  // the library forgets the listener; the number stays until dup3
    R.dup3(placeholder, fd, cloexec ? O_CLOEXEC : 0);
    add_dormant(fd, spec);
  }
  R.close(placeholder);
  log::write(log::kDebug, "shim",
             "fork: fd %d: listener set aside in this process (unused since listen or the last fork); it listens "
             "again when used",
             fds.front().first);
}

// ---------------------------------------------------------------- the transport's bind

ListenArm::ListenArm(ListenSpec *spec) { t_arm = spec; }
ListenArm::~ListenArm() { t_arm = nullptr; }

int transport_bind(int fd, const sockaddr *addr, socklen_t len) {
  ListenSpec *spec = t_arm;
  uint16_t port = 0;
  if (!spec || port_of(addr, len, &port) < 0 || addr->sa_family != spec->domain) return 0;
  const Real &R = real();
  if (spec->anchor >= 0 && port == spec_port(*spec)) {
    // The processes share the kernel's queue: libfabric listens on the anchor.
    const int fdfl = R.fcntl(fd, F_GETFD);
    if (R.dup3(spec->anchor, fd, fdfl >= 0 && (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0) == fd) {
      mark_transport_fd(fd);  // another file on this number now
      return 1;
    }
  }
  if (addr->sa_family == AF_INET6 && spec->v6only >= 0)
    R.setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &spec->v6only, sizeof spec->v6only);
  return 0;
}

}  // namespace gpusock::preload
