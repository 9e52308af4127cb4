// libgpusock_preload.so: signals, fork and exec.
//
// Signals. Every handler the program installs (sigaction, signal) is wrapped by
// a trampoline that counts deliveries per thread and remembers SA_RESTART, so
// the shim's emulated waits return EINTR for a signal that arrived while they
// were spinning, and socket calls restart after an SA_RESTART handler as the
// kernel's do (signal(7)).
//
// fork. A gpusock connection lives in this process (transport endpoints,
// registered rings, a progress thread), which the child cannot share. At fork
// each connected gpusock socket gets a relay: an AF_UNIX socketpair whose one
// end replaces the socket's fd numbers in the child (a working kernel stream
// socket, also after exec) and whose other end a relay thread in the parent
// pumps to and from the gpusock connection. The child's data goes out at once.
// Kernel sockets give incoming data to whichever process reads first; the relay
// passes it to the child once the parent has closed all its fds of the socket,
// once the child has written to it, or while the parent has neither read nor
// waited for readability on it for 50 ms (a parent in waitpid). A parent that
// keeps using the socket keeps its data. Listening sockets are not relayed: in the child they are
// unbound kernel sockets (accept fails with EINVAL). The library abandons its
// inherited state in the child (Engine::fork_child), so a child that does not
// exec can still make new gpusock sockets.
//
// exec. gpusock sockets cannot survive exec (their state is the process
// image): before the exec each one is closed in order (flushed, DISCONNECT
// sent; at most 5 s), so the peer sees an orderly end rather than a hang.
#include "preload/shim.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

extern char **environ;

namespace gpusock::preload {

thread_local unsigned t_signals __attribute__((tls_model("initial-exec"))) = 0;
thread_local int t_signal_restart __attribute__((tls_model("initial-exec"))) = 0;

// ------------------------------------------------------------------ signals

namespace {

struct Handler {
  std::atomic<uintptr_t> fn{0};
  std::atomic<int> flags{0};
};
Handler g_handlers[_NSIG];

void trampoline(int sig, siginfo_t *info, void *uc) {
  const int saved = errno;
  ++t_signals;
  const int flags = g_handlers[sig].flags.load(std::memory_order_relaxed);
  const uintptr_t fn = g_handlers[sig].fn.load(std::memory_order_relaxed);
  t_signal_restart = (flags & SA_RESTART) ? 1 : 0;
  if (flags & SA_RESETHAND) g_handlers[sig].fn.store(0, std::memory_order_relaxed);
  errno = saved;
  if (!fn) return;
  if (flags & SA_SIGINFO) reinterpret_cast<void (*)(int, siginfo_t *, void *)>(fn)(sig, info, uc);
  else reinterpret_cast<void (*)(int)>(fn)(sig);
}

}  // namespace

// libfabric on Debian pulls in libinfinipath (through its psm provider), whose
// constructor installs a backtrace handler for SIGINT, SIGILL, SIGABRT, SIGBUS,
// SIGSEGV and SIGTERM before any program code runs. That handler is not
// async-signal-safe (it can deadlock in malloc, leaving the process alive after
// SIGTERM) and changes what the signals do. The shim gives the program back the
// kernel's default action for every signal still owned by that library.
void restore_hijacked_signals() {
  for (int sig : {SIGINT, SIGILL, SIGABRT, SIGBUS, SIGSEGV, SIGTERM, SIGFPE, SIGQUIT}) {
    const uintptr_t fn = g_handlers[sig].fn.load();
    if (!fn) continue;
    Dl_info info;
    if (!dladdr(reinterpret_cast<void *>(fn), &info) || !info.dli_fname) continue;
    if (!strstr(info.dli_fname, "libinfinipath") && !strstr(info.dli_fname, "libpsm")) continue;
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    real().sigaction(sig, &dfl, nullptr);
    g_handlers[sig].fn.store(0);
    log(2, "signal %d: removed %s's handler", sig, info.dli_fname);
  }
}

}  // namespace gpusock::preload

using namespace gpusock::preload;

__attribute__((constructor)) static void gpusock_preload_init() {
  init_config();
  restore_hijacked_signals();
}

GS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  const Real &R = real();
  if (sig <= 0 || sig >= _NSIG || sig == SIGKILL || sig == SIGSTOP) return R.sigaction(sig, act, old);
  const uintptr_t prev_fn = g_handlers[sig].fn.load();
  const int prev_flags = g_handlers[sig].flags.load();
  struct sigaction prev {};
  int r;
  if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN) {
    struct sigaction k = *act;
    k.sa_sigaction = trampoline;
    k.sa_flags |= SA_SIGINFO;
    g_handlers[sig].flags.store(act->sa_flags);
    g_handlers[sig].fn.store((act->sa_flags & SA_SIGINFO) ? reinterpret_cast<uintptr_t>(act->sa_sigaction)
                                                          : reinterpret_cast<uintptr_t>(act->sa_handler));
    r = R.sigaction(sig, &k, &prev);
    if (r < 0) {
      g_handlers[sig].fn.store(prev_fn);
      g_handlers[sig].flags.store(prev_flags);
    }
  } else {
    r = R.sigaction(sig, act, &prev);
    if (r == 0 && act) g_handlers[sig].fn.store(0);
  }
  if (r == 0 && old) {
    *old = prev;
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == trampoline) {  // show the program its own handler
      old->sa_flags = prev_flags;
      if (prev_flags & SA_SIGINFO) old->sa_sigaction = reinterpret_cast<void (*)(int, siginfo_t *, void *)>(prev_fn);
      else old->sa_handler = reinterpret_cast<void (*)(int)>(prev_fn);
    }
  }
  return r;
}

// glibc's signal() has BSD semantics: SA_RESTART, the signal blocked in its handler.
GS_EXPORT sighandler_t signal(int sig, sighandler_t handler) {
  struct sigaction a {}, o{};
  a.sa_handler = handler;
  sigemptyset(&a.sa_mask);
  if (sig > 0 && sig < _NSIG) sigaddset(&a.sa_mask, sig);
  a.sa_flags = SA_RESTART;
  if (sigaction(sig, &a, &o) < 0) return SIG_ERR;
  return o.sa_handler;
}

GS_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) { return signal(sig, handler); }

GS_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler) {
  struct sigaction a {}, o{};
  a.sa_handler = handler;
  sigemptyset(&a.sa_mask);
  a.sa_flags = SA_RESETHAND | SA_NODEFER;
  if (sigaction(sig, &a, &o) < 0) return SIG_ERR;
  return o.sa_handler;
}

// ------------------------------------------------------------------ fork relays

namespace gpusock::preload {

namespace {

struct Relay {
  int r = -1;  // our end of the socketpair (non-blocking, close-on-exec)
  int g = -1;  // the shim's own gpusock fd of the socket (kInternal)
  std::shared_ptr<SockInfo> info;
  std::vector<int> parent_fds;  // the parent's fds of the socket at fork time
  uint64_t touch_sum = 0;       // their receive activity, last seen
  std::chrono::steady_clock::time_point touch_changed;
  bool child_wrote = false;
  bool c2g_eof = false, g2c_eof = false;
  bool child_gone = false, gs_broken = false;
  bool child_unwritable = false;  // the child's end no longer takes data (it closed)
  std::vector<char> c2g, g2c;  // bytes not yet passed on
  size_t c2g_off = 0, g2c_off = 0;
  bool c2g_pending() const { return c2g_off < c2g.size(); }
  bool g2c_pending() const { return g2c_off < g2c.size(); }
};

std::mutex &relay_mu() {
  static auto *m = new std::mutex();
  return *m;
}
std::vector<Relay *> &relays() {
  static auto *v = new std::vector<Relay *>();
  return *v;
}
int g_relay_wake = -1;
bool g_relay_thread = false;

constexpr size_t kRelayChunk = 64 * 1024;

constexpr auto kParentIdle = std::chrono::milliseconds(50);

uint64_t parent_touches(const Relay &x) {
  uint64_t sum = 0;
  for (int fd : x.parent_fds)
    if (sock_info(fd) == x.info)
      if (FdSlot *s = slot(fd)) sum += s->rtouch.load(std::memory_order_relaxed);
  return sum;
}

// Does incoming data go to the child? Once the parent has closed the socket,
// once the child has written to it, or while the parent neither reads nor
// waits for readability on it (kernel sockets give data to whoever reads).
bool to_child(Relay &x) {
  if (x.child_wrote || x.info->user_fds.load() == 0) return true;
  const uint64_t t = parent_touches(x);
  const auto now = std::chrono::steady_clock::now();
  if (t != x.touch_sum) {
    x.touch_sum = t;
    x.touch_changed = now;
    return false;
  }
  return now - x.touch_changed >= kParentIdle;
}

// One pass over a relay; true if it moved anything.
bool pump_once(Relay &x, short r_revents, char *buf) {
  const Real &R = real();
  const bool to_child = gpusock::preload::to_child(x);
  const size_t before = x.c2g_off + x.g2c_off + x.c2g.size() + x.g2c.size() + x.c2g_eof + x.g2c_eof;
  // child -> gpusock
  if (!x.c2g_eof && !x.c2g_pending()) {
    const ssize_t n = R.read(x.r, buf, kRelayChunk);
    if (n > 0) {
      x.c2g.assign(buf, buf + n);
      x.c2g_off = 0;
      x.child_wrote = true;
    } else if (n == 0) {
      x.c2g_eof = true;
      pollfd p{x.r, POLLIN, 0};
      R.poll(&p, 1, 0);
      if ((p.revents | r_revents) & POLLHUP) x.child_gone = true;  // closed, not just SHUT_WR
      else if (!x.gs_broken) gs_shutdown(x.g, SHUT_WR);
    } else if (errno != EAGAIN && errno != EINTR) {
      x.c2g_eof = x.child_gone = true;
    }
  }
  if (x.c2g_pending() && !x.gs_broken) {
    const ssize_t s = gs_send(x.g, x.c2g.data() + x.c2g_off, x.c2g.size() - x.c2g_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (s > 0) x.c2g_off += static_cast<size_t>(s);
    else if (s != -EAGAIN && s != -EINTR) x.gs_broken = true;
  }
  if (x.gs_broken) x.c2g_off = x.c2g.size();
  // gpusock -> child
  if (to_child && !x.g2c_eof && !x.g2c_pending() && !x.child_gone && !x.child_unwritable) {
    const ssize_t n = gs_recv(x.g, buf, kRelayChunk, MSG_DONTWAIT);
    if (n > 0) {
      x.g2c.assign(buf, buf + n);
      x.g2c_off = 0;
    } else if (n == 0 || (n != -EAGAIN && n != -EINTR)) {
      x.g2c_eof = true;
      R.shutdown(x.r, SHUT_WR);
    }
  }
  if (x.g2c_pending() && !x.child_gone && !x.child_unwritable) {
    const ssize_t w = R.send(x.r, x.g2c.data() + x.g2c_off, x.g2c.size() - x.g2c_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w > 0) x.g2c_off += static_cast<size_t>(w);
    // The child closed: nothing more goes to it, but what it wrote before is
    // still to be read from our end (child_gone comes with that EOF).
    else if (w < 0 && errno != EAGAIN && errno != EINTR) x.child_unwritable = true;
  }
  if (x.child_gone || x.child_unwritable) x.g2c_off = x.g2c.size();
  return before != x.c2g_off + x.g2c_off + x.c2g.size() + x.g2c.size() + x.c2g_eof + x.g2c_eof;
}

void pump(Relay &x, short r_revents, char *buf) {
  for (int i = 0; i < 64 && pump_once(x, r_revents, buf);) ++i;
}

bool finished(const Relay &x) {
  if (x.child_gone && !x.c2g_pending()) return true;
  if (x.c2g_eof && x.g2c_eof && !x.c2g_pending() && !x.g2c_pending()) return true;
  return false;
}

void relay_loop() {
  ++t_inside;  // everything this thread calls goes to libc or the library directly
  std::vector<char> buf(kRelayChunk);
  std::vector<pollfd> p;
  std::vector<Relay *> rs;
  for (;;) {
    {
      std::lock_guard lock(relay_mu());
      rs = relays();
    }
    p.clear();
    p.push_back({g_relay_wake, POLLIN, 0});
    for (Relay *x : rs) {
      const bool to_child = gpusock::preload::to_child(*x);
      short re = 0, ge = 0;
      if (!x->c2g_eof && !x->c2g_pending()) re |= POLLIN;
      if (x->g2c_pending()) re |= POLLOUT;
      if (x->c2g_pending()) ge |= POLLOUT;
      if (to_child && !x->g2c_eof && !x->g2c_pending()) ge |= POLLIN;
      p.push_back({x->r, re, 0});
      p.push_back({x->g, ge, 0});
    }
    gs_poll(p.data(), p.size(), 20);
    if (p[0].revents & POLLIN) {
      uint64_t v;
      ssize_t n = real().read(g_relay_wake, &v, sizeof v);
      (void)n;
    }
    std::vector<Relay *> done;
    for (size_t i = 0; i < rs.size(); ++i) {
      pump(*rs[i], p[1 + 2 * i].revents, buf.data());
      if (finished(*rs[i])) done.push_back(rs[i]);
    }
    if (done.empty()) continue;
    {
      std::lock_guard lock(relay_mu());
      auto &v = relays();
      for (Relay *x : done) v.erase(std::remove(v.begin(), v.end(), x), v.end());
    }
    for (Relay *x : done) {
      log(2, "fork relay for fd %d finished", x->g);
      real().close(x->r);
      set_kind(x->g, kKernel);
      gs_close(x->g);  // drops the relay's reference; the last one closes the connection
      delete x;
    }
  }
}

void wake_relays() {
  uint64_t one = 1;
  ssize_t n = real().write(g_relay_wake, &one, sizeof one);
  (void)n;
}

// At exit the relays die with the process. Bytes a child wrote before it
// closed the socket are still on their way (in the socketpair or the relay):
// deliver them first, as the kernel would have from its send buffer. Relays
// whose child still holds the socket end with the process (docs/preload.md).
void relays_at_exit() {
  const Real &R = real();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    bool draining = false;
    {
      std::lock_guard lock(relay_mu());
      for (Relay *x : relays()) {
        pollfd p{x->r, 0, 0};
        R.poll(&p, 1, 0);
        if ((p.revents & POLLHUP) || x->child_gone) draining = true;
      }
    }
    if (!draining) return;
    wake_relays();
    usleep(1000);
  }
}

void start_relay_thread_locked() {
  if (g_relay_thread) return;
  static bool registered = false;
  if (!registered) {
    std::atexit(relays_at_exit);  // runs before the library's own exit flush
    registered = true;
  }
  if (g_relay_wake < 0) g_relay_wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::thread(relay_loop).detach();
  g_relay_thread = true;
}

}  // namespace

void relay_after_fork_child() {
  // The relay thread and its work belong to the parent; the child closes its
  // copies of the relay fds (done by the caller) and starts empty.
  new (&relay_mu()) std::mutex();
  relays().clear();  // the objects are the parent's business (leaked copies)
  if (g_relay_wake >= 0) real().close(g_relay_wake);
  g_relay_wake = -1;
  g_relay_thread = false;
}

// ------------------------------------------------------------------ exec

void before_exec() {
  auto fds = all_gs_fds();
  if (fds.empty()) return;
  log(1, "exec: closing %zu gpusock socket fd(s) in order (they cannot survive exec)", fds.size());
  for (auto &[fd, info] : fds) {
    linger l{1, 5};
    {
      Inside guard;
      gs_setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    }
    close(fd);
  }
}

}  // namespace gpusock::preload

GS_EXPORT pid_t fork(void) {
  const Real &R = real();
  if (t_inside) return R.fork();
  struct Group {
    std::shared_ptr<SockInfo> info;
    std::vector<std::pair<int, bool>> fds;  // number, close-on-exec
    bool listening = false;
    bool nonblocking = false;
    int c = -1, r = -1, g = -1;
  };
  std::map<SockInfo *, Group> groups;
  for (auto &[fd, info] : all_gs_fds()) {
    Group &gr = groups[info.get()];
    gr.info = info;
    const int fdfl = R.fcntl(fd, F_GETFD);
    gr.fds.push_back({fd, fdfl >= 0 && (fdfl & FD_CLOEXEC)});
    gr.listening = info->listening.load();
    Inside guard;
    gr.nonblocking = gs_fcntl(fd, F_GETFL) & O_NONBLOCK;
  }
  for (auto &[key, gr] : groups) {
    const int first = gr.fds.front().first;
    if (gr.listening) {
      gr.c = R.socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      continue;
    }
    int sv[2];
    if (R.socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) continue;
    gr.r = sv[0];
    gr.c = sv[1];
    R.fcntl(gr.r, F_SETFL, O_NONBLOCK);
    if (gr.nonblocking) R.fcntl(gr.c, F_SETFL, O_NONBLOCK);
    Inside guard;
    gr.g = gs_dup(first);
    if (gr.g >= 0) {
      gs_fcntl(gr.g, F_SETFD, FD_CLOEXEC);
      set_kind(gr.g, kInternal);
    } else {
      R.close(gr.r);
      R.close(gr.c);
      gr.r = gr.c = -1;
    }
  }
  // Hold the shim's tables across the fork so the child's copies are whole.
  std::unique_lock relay_lock(relay_mu());
  std::unique_lock fd_lock(fd_table_mutex());
  std::unique_lock epoll_lock(epoll_table_mutex());
  std::vector<int> old_relay_fds;
  for (Relay *x : relays()) {
    old_relay_fds.push_back(x->r);
    old_relay_fds.push_back(x->g);
  }
  const pid_t pid = R.fork();
  epoll_lock.unlock();
  fd_lock.unlock();
  if (pid == 0) {
    relay_lock.unlock();
    for (auto &[key, gr] : groups) {
      if (gr.c < 0) continue;
      for (auto &[fd, cloexec] : gr.fds) R.dup3(gr.c, fd, cloexec ? O_CLOEXEC : 0);
      R.close(gr.c);
      if (gr.r >= 0) R.close(gr.r);
      if (gr.g >= 0) R.close(gr.g);
    }
    for (int fd : old_relay_fds) R.close(fd);
    forget_all_gs_fds_in_child();
    transport_fds_cloexec_in_child();  // the parent's libfabric sockets do not follow an exec
    epoll_after_fork_child();
    relay_after_fork_child();
    return 0;
  }
  for (auto &[key, gr] : groups) {
    if (gr.c >= 0) R.close(gr.c);
    if (gr.r < 0) continue;
    if (pid < 0) {
      R.close(gr.r);
      set_kind(gr.g, kKernel);
      Inside guard;
      gs_close(gr.g);
      continue;
    }
    auto *x = new Relay();
    x->r = gr.r;
    x->g = gr.g;
    x->info = gr.info;
    for (auto &[fd, cloexec] : gr.fds) x->parent_fds.push_back(fd);
    x->touch_sum = parent_touches(*x);
    x->touch_changed = std::chrono::steady_clock::now();
    relays().push_back(x);
    log(2, "fork: relaying fd %d to child %d", gr.fds.front().first, static_cast<int>(pid));
  }
  if (pid > 0 && !relays().empty()) {
    start_relay_thread_locked();
    wake_relays();
  }
  return pid;
}

// ------------------------------------------------------------------ exec family

GS_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().execve(path, argv, envp);
}

GS_EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

GS_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().execvpe(file, argv, envp);
}

GS_EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

GS_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().fexecve(fd, argv, envp);
}

GS_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
  if (!real().execveat) {
    errno = ENOSYS;
    return -1;
  }
  if (!t_inside) before_exec();
  return real().execveat(dirfd, path, argv, envp, flags);
}

namespace {

std::vector<char *> collect_args(const char *arg0, va_list ap) {
  std::vector<char *> v;
  v.push_back(const_cast<char *>(arg0));
  while (v.back()) v.push_back(va_arg(ap, char *));
  return v;
}

}  // namespace

GS_EXPORT int execl(const char *path, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto v = collect_args(arg, ap);
  va_end(ap);
  return execve(path, v.data(), environ);
}

GS_EXPORT int execlp(const char *file, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto v = collect_args(arg, ap);
  va_end(ap);
  return execvpe(file, v.data(), environ);
}

GS_EXPORT int execle(const char *path, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  std::vector<char *> v;
  v.push_back(const_cast<char *>(arg));
  while (v.back()) v.push_back(va_arg(ap, char *));
  char *const *envp = va_arg(ap, char *const *);
  va_end(ap);
  return execve(path, v.data(), envp);
}
