// libgpusock_preload.so: socket calls. Decides per socket whether it is the
// kernel's or gpusock's and forwards each call accordingly (docs/preload.md).
//
// A TCP socket starts life as a kernel socket marked "pending". At bind (with a
// port), listen or connect the port lists decide: a selected socket is
// "upgraded" by creating a gpusock socket and dup3()-ing its reserved fd over
// the kernel socket's number, which atomically replaces the kernel socket; an
// excluded one simply stays the kernel's, untouched.
#include "preload/shim.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <string>
#include <unordered_map>

#define GS_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpusock::preload {

thread_local int t_inside __attribute__((tls_model("initial-exec"))) = 0;
// close() of this fd number from inside the library is skipped once (dup2 over
// a gpusock fd: the library forgets the socket, the number is replaced).
thread_local int t_skip_close __attribute__((tls_model("initial-exec"))) = -1;

// ------------------------------------------------------------------ libc

namespace {

template <class T>
void resolve(T *fn, const char *name) {
  *fn = reinterpret_cast<T>(dlsym(RTLD_NEXT, name));
}

Real load_real() {
  Real r{};
#define R(name) resolve(&r.name, #name)
  R(socket); R(socketpair); R(bind); R(listen); R(accept); R(accept4); R(connect);
  R(read); R(write); R(readv); R(writev); R(recv); R(send); R(recvfrom); R(sendto);
  R(recvmsg); R(sendmsg); R(sendfile); R(poll); R(ppoll); R(select); R(pselect);
  R(epoll_create); R(epoll_create1); R(epoll_ctl); R(epoll_wait); R(epoll_pwait); R(epoll_pwait2);
  R(fcntl); R(ioctl); R(setsockopt); R(getsockopt); R(getsockname); R(getpeername);
  R(shutdown); R(close); R(close_range); R(dup); R(dup2); R(dup3); R(fork); R(execve); R(execveat);
  R(fexecve); R(execvpe); R(fstat); R(sigaction); R(eventfd); R(pipe); R(pipe2);
#undef R
  return r;
}

}  // namespace

const Real &real() {
  static const Real r = load_real();
  return r;
}

// ------------------------------------------------------------------ fd table

namespace {

constexpr int kChunkBits = 12;
constexpr int kChunk = 1 << kChunkBits;
constexpr int kMaxChunks = 256;  // fds below 1M
std::atomic<FdSlot *> g_chunks[kMaxChunks];

struct Pending {
  int domain = AF_INET;
  sockaddr_storage bound{};
  socklen_t bound_len = 0;
  struct Opt {
    int level, name;
    std::vector<char> value;
  };
  std::vector<Opt> opts;
};

// Never destroyed: the library's threads may run after static destructors.
std::mutex &fd_mu() {
  static auto *m = new std::mutex();
  return *m;
}
std::unordered_map<int, std::shared_ptr<SockInfo>> &infos() {
  static auto *m = new std::unordered_map<int, std::shared_ptr<SockInfo>>();
  return *m;
}
std::unordered_map<int, Pending> &pendings() {
  static auto *m = new std::unordered_map<int, Pending>();
  return *m;
}

}  // namespace

std::mutex &fd_table_mutex() { return fd_mu(); }

FdSlot *slot(int fd, bool create) {
  if (fd < 0 || fd >= kMaxChunks * kChunk) return nullptr;
  auto &chunk = g_chunks[fd >> kChunkBits];
  FdSlot *c = chunk.load(std::memory_order_acquire);
  if (!c) {
    if (!create) return nullptr;
    auto *fresh = new FdSlot[kChunk];
    if (!chunk.compare_exchange_strong(c, fresh, std::memory_order_acq_rel)) delete[] fresh;
    else c = fresh;
  }
  return &c[fd & (kChunk - 1)];
}

void set_kind(int fd, uint8_t kind) {
  if (FdSlot *s = slot(fd, kind != kKernel)) s->kind.store(kind, std::memory_order_release);
}

std::shared_ptr<SockInfo> sock_info(int fd) {
  std::lock_guard lock(fd_mu());
  auto it = infos().find(fd);
  return it == infos().end() ? nullptr : it->second;
}

void attach_gs_fd(int fd, std::shared_ptr<SockInfo> info) {
  if (!info) info = std::make_shared<SockInfo>();
  info->user_fds.fetch_add(1);
  {
    std::lock_guard lock(fd_mu());
    infos()[fd] = std::move(info);
    pendings().erase(fd);
  }
  set_kind(fd, kGs);
}

std::shared_ptr<SockInfo> detach_gs_fd(int fd) {
  set_kind(fd, kKernel);
  std::shared_ptr<SockInfo> info;
  {
    std::lock_guard lock(fd_mu());
    auto it = infos().find(fd);
    if (it == infos().end()) return nullptr;
    info = std::move(it->second);
    infos().erase(it);
  }
  info->user_fds.fetch_sub(1);
  return info;
}

std::vector<std::pair<int, std::shared_ptr<SockInfo>>> all_gs_fds() {
  std::lock_guard lock(fd_mu());
  return {infos().begin(), infos().end()};
}

void mark_transport_fd(int fd) {
  FdSlot *s = slot(fd, true);
  if (!s) return;
  struct stat st;
  if (real().fstat(fd, &st) < 0) return;
  s->ino.store(static_cast<uint64_t>(st.st_ino) ^ (static_cast<uint64_t>(st.st_dev) << 48));
  s->kind.store(kTransport, std::memory_order_release);
}

void transport_fds_cloexec_in_child() {
  const Real &R = real();
  for (int c = 0; c < kMaxChunks; ++c) {
    FdSlot *chunk = g_chunks[c].load();
    if (!chunk) continue;
    for (int i = 0; i < kChunk; ++i) {
      if (chunk[i].kind.load() != kTransport) continue;
      const int fd = c * kChunk + i;
      struct stat st;
      if (R.fstat(fd, &st) == 0 &&
          (static_cast<uint64_t>(st.st_ino) ^ (static_cast<uint64_t>(st.st_dev) << 48)) == chunk[i].ino.load()) {
        const int fl = R.fcntl(fd, F_GETFD);
        if (fl >= 0) R.fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
      }
      chunk[i].kind.store(kKernel);
    }
  }
}

void forget_all_gs_fds_in_child() {
  for (auto &[fd, info] : infos()) set_kind(fd, kKernel);
  infos().clear();
  for (int c = 0; c < kMaxChunks; ++c) {
    FdSlot *chunk = g_chunks[c].load();
    if (!chunk) continue;
    for (int i = 0; i < kChunk; ++i)
      if (chunk[i].kind.load() == kInternal) chunk[i].kind.store(kKernel);
  }
}

// ------------------------------------------------------------------ helpers

namespace {

int port_of(const sockaddr *addr, socklen_t len, uint16_t *port) {
  if (!addr) return -1;
  if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    *port = ntohs(reinterpret_cast<const sockaddr_in *>(addr)->sin_port);
    return 0;
  }
  if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    *port = ntohs(reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_port);
    return 0;
  }
  return -1;
}

std::string addr_text(const sockaddr *addr, socklen_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (port_of(addr, len, &port) < 0) return "?";
  if (addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(addr)->sin_addr, host, sizeof host);
  else
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_addr, host, sizeof host);
  char out[INET6_ADDRSTRLEN + 16];
  snprintf(out, sizeof out, addr->sa_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
  return out;
}

const char *transport_name() {
  const char *t = getenv("GPUSOCK_TRANSPORT");
  return t && *t ? t : "default transport";
}

// Is this socket() call made by gpusock or libfabric themselves (from a thread
// the guard does not cover, such as a provider's own thread)?
bool called_from_transport(void *ret) {
  Dl_info info;
  if (!dladdr(ret, &info) || !info.dli_fname) return false;
  const char *f = info.dli_fname;
  return strstr(f, "libfabric") || strstr(f, "libgpusock.so") || strstr(f, "librdmacm") ||
         strstr(f, "libibverbs") || strstr(f, "libefa") || strstr(f, "libpsm") || strstr(f, "rdmav");
}

}  // namespace

bool transport_caller(void *ret) { return t_inside || called_from_transport(ret); }

namespace {

// Can this process create gpusock sockets? Probed once (a gs_socket that is
// closed again); the answer and the library's explanation are kept.
std::mutex g_probe_mu;
std::atomic<int> g_probe{1};  // 1 unknown, 0 usable, < 0 the error
char g_probe_error[256];

int probe_transport() {
  const int known = g_probe.load(std::memory_order_acquire);
  if (known <= 0) return known;
  std::lock_guard lock(g_probe_mu);
  if (g_probe.load() <= 0) return g_probe.load();
  Inside guard;
  const int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    snprintf(g_probe_error, sizeof g_probe_error, "%s", gs_last_error());
    if (!g_probe_error[0]) snprintf(g_probe_error, sizeof g_probe_error, "%s", strerror(-fd));
    g_probe.store(fd, std::memory_order_release);
  } else {
    gs_close(fd);
    g_probe.store(0, std::memory_order_release);
  }
  return g_probe.load();
}

bool intercept_candidate(int domain, int type, int protocol) {
  if (!config().enabled) return false;
  if (domain != AF_INET && domain != AF_INET6) return false;
  if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) return false;
  if (protocol != 0 && protocol != IPPROTO_TCP) return false;
  return rules_select(domain, type, protocol);
}

bool take_pending(int fd, Pending *out) {
  std::lock_guard lock(fd_mu());
  auto it = pendings().find(fd);
  if (it == pendings().end()) return false;
  *out = it->second;
  return true;
}

// The socket stays the kernel's for good (its port is excluded).
void finalize_kernel(int fd) {
  {
    std::lock_guard lock(fd_mu());
    pendings().erase(fd);
  }
  set_kind(fd, kKernel);
  epoll_forget_fd(fd);
}

void note_timeout(int fd, int name, const void *val, socklen_t len) {
  if (!val || len < sizeof(timeval)) return;
  const auto *tv = static_cast<const timeval *>(val);
  const int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec;
  auto info = sock_info(fd);
  if (!info) return;
  (name == SO_RCVTIMEO ? info->rcvtimeo_us : info->sndtimeo_us).store(us < 0 ? 0 : us);
}

// Replaces the pending kernel socket fd by a gpusock socket on the same number.
// Returns 0 or a negated errno (the kernel socket is then left as it was).
int upgrade(int fd, const Pending &p) {
  const Real &R = real();
  const int fl = R.fcntl(fd, F_GETFL);
  const int fdfl = R.fcntl(fd, F_GETFD);
  if (fl < 0 || fdfl < 0) return -errno;
  Inside guard;
  const int tmp = gs_socket(p.domain, SOCK_STREAM | ((fl & O_NONBLOCK) ? SOCK_NONBLOCK : 0), 0);
  if (tmp < 0) return tmp;
  const Config &c = config();
  if (c.iomap_size >= 0) gs_setsockopt(tmp, SOL_RDMA, RDMA_IOMAPSIZE, &c.iomap_size, sizeof(int));
  for (const auto &o : p.opts) {
    if (o.level == SOL_SOCKET && (o.name == SO_RCVTIMEO || o.name == SO_SNDTIMEO)) continue;
    gs_setsockopt(tmp, o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
  }
  const int r = gs_dup3(tmp, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
  gs_close(tmp);
  if (r < 0) return r;
  attach_gs_fd(fd, nullptr);
  for (const auto &o : p.opts)
    if (o.level == SOL_SOCKET && (o.name == SO_RCVTIMEO || o.name == SO_SNDTIMEO))
      note_timeout(fd, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
  epoll_upgrade_fd(fd);
  return 0;
}

// Restart rule for a gpusock call that returned -EINTR: the kernel restarts
// socket calls after a handler installed with SA_RESTART (signal(7)), unless a
// timeout is set; a wake-up with no handler run is not an interruption at all.
bool restart_after_eintr(unsigned signals_before) {
  if (t_signals == signals_before) return true;
  return t_signal_restart != 0;
}

using Clock = std::chrono::steady_clock;

// Blocking calls on gpusock sockets are made of non-blocking attempts and the
// shim's own waits (emulated_poll), never of the library's internal blocking
// wait: between two sleeps the shim sees every signal handler that ran on this
// thread, so a signal can never be lost in a spin, and SA_RESTART, SO_RCVTIMEO
// and SO_SNDTIMEO behave as on a kernel socket.
//
// Waits for events on a gpusock fd until deadline (max(): none). Returns 0
// when ready, -EAGAIN at the deadline, -EINTR when a signal handler ran.
int wait_gs(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  if (deadline == Clock::time_point::max()) {
    const int n = emulated_poll(&p, 1, nullptr, nullptr);
    return n < 0 ? -errno : 0;
  }
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
  if (left <= 0) return -EAGAIN;
  timespec ts{static_cast<time_t>(left / 1000000), static_cast<long>(left % 1000000) * 1000};
  const int n = emulated_poll(&p, 1, &ts, nullptr);
  if (n < 0) return -errno;
  return n == 0 ? -EAGAIN : 0;
}

bool gs_nonblocking(int fd) {
  Inside guard;
  const int fl = gs_fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_NONBLOCK);
}

// Waits for `events` on a blocking gpusock call: 1 ready, 0 a restarted
// signal (wait again), < 0 the call's result. A handler that ran turns into
// -EINTR unless it has SA_RESTART and no timeout is set (signal(7)).
int blocking_wait(int fd, short events, Clock::time_point deadline, bool has_timeout) {
  const unsigned before = t_signals;
  const int w = wait_gs(fd, events, deadline);
  if (w == -EINTR && !has_timeout && restart_after_eintr(before)) return 0;
  return w < 0 ? w : 1;
}

Clock::time_point deadline_for(int64_t timeo_us) {
  return timeo_us > 0 ? Clock::now() + std::chrono::microseconds(timeo_us) : Clock::time_point::max();
}

// Every receive-side call on a gpusock fd. call(flags) makes one attempt.
template <class F>
ssize_t gs_input(int fd, int flags, F call) {
  if (FdSlot *s = slot(fd)) {
    s->rgen.fetch_add(1, std::memory_order_relaxed);
    s->rtouch.fetch_add(1, std::memory_order_relaxed);
  }
  if ((flags & MSG_DONTWAIT) || gs_nonblocking(fd)) {
    Inside guard;
    return libc_result(call(flags));
  }
  auto info = sock_info(fd);
  const int64_t timeo = info ? info->rcvtimeo_us.load() : 0;
  const auto deadline = deadline_for(timeo);
  if (flags & MSG_WAITALL) flags &= ~MSG_WAITALL;  // handled below by the caller's loop
  for (;;) {
    ssize_t r;
    {
      Inside guard;
      r = call(flags | MSG_DONTWAIT);
    }
    if (r != -EAGAIN) return libc_result(r);
    const int w = blocking_wait(fd, POLLIN, deadline, timeo > 0);
    if (w < 0) return libc_result<ssize_t>(w);
  }
}

// The part of iov after `skip` bytes.
std::vector<iovec> iov_after(const iovec *iov, int iovcnt, size_t skip) {
  std::vector<iovec> out;
  for (int i = 0; i < iovcnt; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    out.push_back({static_cast<char *>(iov[i].iov_base) + skip, iov[i].iov_len - skip});
    skip = 0;
  }
  return out;
}

size_t iov_bytes(const iovec *iov, int iovcnt) {
  size_t n = 0;
  for (int i = 0; i < iovcnt; ++i) n += iov[i].iov_len;
  return n;
}

ssize_t raw_send(int fd, const iovec *iov, size_t iovcnt, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec *>(iov);
  m.msg_iovlen = iovcnt;
  Inside guard;
  return gs_sendmsg(fd, &m, flags);
}

ssize_t raw_recv(int fd, const iovec *iov, size_t iovcnt, int flags) {
  msghdr m{};
  m.msg_iov = const_cast<iovec *>(iov);
  m.msg_iovlen = iovcnt;
  return gs_recvmsg(fd, &m, flags);
}

ssize_t recv_iov(int fd, const iovec *iov, int iovcnt, int flags) {
  if (!(flags & MSG_WAITALL) || (flags & (MSG_PEEK | MSG_DONTWAIT)))
    return gs_input(fd, flags, [&](int f) { return raw_recv(fd, iov, static_cast<size_t>(iovcnt), f); });
  // MSG_WAITALL on a blocking socket: until the buffer is full, EOF, an error or a signal.
  const size_t total = iov_bytes(iov, iovcnt);
  size_t done = 0;
  while (done < total) {
    auto rest = iov_after(iov, iovcnt, done);
    const ssize_t r = gs_input(fd, flags & ~MSG_WAITALL, [&](int f) { return raw_recv(fd, rest.data(), rest.size(), f); });
    if (r <= 0) return done > 0 ? static_cast<ssize_t>(done) : r;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

ssize_t send_iov(int fd, const iovec *iov, int iovcnt, int flags) {
  if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
  const int call_flags = flags & ~MSG_NOSIGNAL;
  ssize_t r;
  if ((flags & MSG_DONTWAIT) || gs_nonblocking(fd)) {
    r = raw_send(fd, iov, static_cast<size_t>(iovcnt), call_flags);
  } else {
    // A blocking send returns when everything is queued, or early (with the
    // count so far) on a signal, a timeout or an error.
    auto info = sock_info(fd);
    const int64_t timeo = info ? info->sndtimeo_us.load() : 0;
    const auto deadline = deadline_for(timeo);
    const size_t total = iov_bytes(iov, iovcnt);
    size_t done = 0;
    for (;;) {
      auto rest = iov_after(iov, iovcnt, done);
      r = raw_send(fd, rest.data(), rest.size(), call_flags | MSG_DONTWAIT);
      if (r > 0) {
        done += static_cast<size_t>(r);
        if (done >= total) break;
        continue;
      }
      if (r == 0 && total == 0) break;
      if (r != -EAGAIN) break;
      const int w = blocking_wait(fd, POLLOUT, deadline, timeo > 0);
      if (w < 0) {
        r = w;
        break;
      }
    }
    if (done > 0) r = static_cast<ssize_t>(done);
  }
  // A write on a connection that can no longer send raises SIGPIPE, as TCP does.
  if (r == -EPIPE && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return libc_result(r);
}

// Clears the shim's state for fd before its number is replaced or closed.
void drop_fd_state(int fd) {
  switch (kind_of(fd)) {
    case kGs:
      epoll_forget_fd(fd);
      detach_gs_fd(fd);
      break;
    case kPending:
      finalize_kernel(fd);
      break;
    case kEpoll:
      epoll_forget_epfd(fd);
      set_kind(fd, kKernel);
      break;
    case kTransport:
      set_kind(fd, kKernel);
      break;
    default:
      break;
  }
}

// newfd is about to receive another file (dup2/dup3 with a kernel source).
// If it is a gpusock socket the library must forget it without closing the
// number, so the replacement stays atomic.
void release_gs_target(int newfd) {
  if (kind_of(newfd) != kGs) {
    drop_fd_state(newfd);
    return;
  }
  drop_fd_state(newfd);
  Inside guard;
  t_skip_close = newfd;
  gs_close(newfd);
  t_skip_close = -1;
}

}  // namespace

}  // namespace gpusock::preload

using namespace gpusock::preload;

// ================================================================== socket calls

GS_EXPORT int socket(int domain, int type, int protocol) {
  const Real &R = real();
  if (t_inside || called_from_transport(__builtin_return_address(0))) {
    const int fd = R.socket(domain, type, protocol);
    if (fd >= 0) mark_transport_fd(fd);
    return fd;
  }
  if (!intercept_candidate(domain, type, protocol)) return R.socket(domain, type, protocol);
  const int st = probe_transport();
  if (st < 0) {
    static std::atomic<bool> warned{false};
    if (config().refuse) {
      if (!warned.exchange(true))
        log(0, "refusing TCP sockets (GPUSOCK_FALLBACK=refuse): %s", g_probe_error);
      errno = -st;
      return -1;
    }
    if (!warned.exchange(true))
      log(0, "%s; falling back to kernel TCP for this process (GPUSOCK_FALLBACK=refuse to fail instead)",
          g_probe_error);
    return R.socket(domain, type, protocol);
  }
  const int fd = R.socket(domain, type, protocol);
  if (fd < 0) return fd;
  {
    std::lock_guard lock(fd_mu());
    Pending p;
    p.domain = domain;
    pendings()[fd] = std::move(p);
  }
  set_kind(fd, kPending);
  return fd;
}

GS_EXPORT int bind(int fd, const sockaddr *addr, socklen_t len) {
  const Real &R = real();
  if (t_inside) return R.bind(fd, addr, len);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    Inside guard;
    return libc_result(gs_bind(fd, addr, len));
  }
  if (k != kPending) return R.bind(fd, addr, len);
  Pending p;
  uint16_t port = 0;
  if (!take_pending(fd, &p) || port_of(addr, len, &port) < 0) {
    finalize_kernel(fd);
    return R.bind(fd, addr, len);
  }
  if (port == 0) {
    // Ephemeral: decided at listen or connect. The kernel picks the port now,
    // and a gpusock listener later binds that same port, so getsockname
    // answers the same before and after listen.
    const int r = R.bind(fd, addr, len);
    if (r == 0) {
      sockaddr_storage actual{};
      socklen_t al = sizeof actual;
      if (R.getsockname(fd, reinterpret_cast<sockaddr *>(&actual), &al) < 0) {
        std::memcpy(&actual, addr, std::min<size_t>(len, sizeof actual));
        al = len;
      }
      std::lock_guard lock(fd_mu());
      auto it = pendings().find(fd);
      if (it != pendings().end()) {
        it->second.bound = actual;
        it->second.bound_len = al;
      }
    }
    return r;
  }
  if (!port_selected(port)) {
    log(1, "fd %d: bind %s: kernel TCP (port not selected)", fd, addr_text(addr, len).c_str());
    finalize_kernel(fd);
    return R.bind(fd, addr, len);
  }
  if (int r = upgrade(fd, p); r < 0) {
    errno = -r;
    return -1;
  }
  Inside guard;
  const int r = gs_bind(fd, addr, len);
  log(1, "fd %d: bind %s: gpusock (%s)%s", fd, addr_text(addr, len).c_str(), transport_name(), r < 0 ? " failed" : "");
  return libc_result(r);
}

GS_EXPORT int listen(int fd, int backlog) {
  const Real &R = real();
  if (t_inside) return R.listen(fd, backlog);
  uint8_t k = kind_of(fd);
  if (k == kPending) {
    Pending p;
    if (!take_pending(fd, &p)) return R.listen(fd, backlog);
    uint16_t port = 0;
    if (p.bound_len) port_of(reinterpret_cast<sockaddr *>(&p.bound), p.bound_len, &port);
    if (!port_selected(port)) {
      log(1, "fd %d: listen on port %u: kernel TCP (port not selected)", fd, port);
      finalize_kernel(fd);
      return R.listen(fd, backlog);
    }
    if (int r = upgrade(fd, p); r < 0) {
      errno = -r;
      return -1;
    }
    if (p.bound_len) {
      Inside guard;
      gs_bind(fd, reinterpret_cast<sockaddr *>(&p.bound), p.bound_len);
    }
    k = kGs;
  }
  if (k != kGs) return R.listen(fd, backlog);
  int r;
  {
    Inside guard;
    r = gs_listen(fd, backlog);
  }
  if (r == 0) {
    if (auto info = sock_info(fd)) info->listening = true;
    if (config().log_level >= 1) {
      sockaddr_storage ss{};
      socklen_t sl = sizeof ss;
      Inside guard;
      gs_getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &sl);
      log(1, "fd %d: listening on %s via gpusock (%s)", fd, addr_text(reinterpret_cast<sockaddr *>(&ss), sl).c_str(),
          transport_name());
    }
  }
  return libc_result(r);
}

GS_EXPORT int connect(int fd, const sockaddr *addr, socklen_t len) {
  const Real &R = real();
  if (t_inside) return R.connect(fd, addr, len);
  uint8_t k = kind_of(fd);
  if (k == kPending) {
    Pending p;
    uint16_t port = 0;
    if (!take_pending(fd, &p) || port_of(addr, len, &port) < 0) {
      finalize_kernel(fd);
      return R.connect(fd, addr, len);
    }
    if (!port_selected(port)) {
      log(1, "fd %d: connect %s: kernel TCP (port not selected)", fd, addr_text(addr, len).c_str());
      finalize_kernel(fd);
      return R.connect(fd, addr, len);
    }
    if (int r = upgrade(fd, p); r < 0) {
      errno = -r;
      return -1;
    }
    if (p.bound_len) {
      Inside guard;
      gs_bind(fd, reinterpret_cast<sockaddr *>(&p.bound), p.bound_len);
    }
    log(1, "fd %d: connect %s via gpusock (%s)", fd, addr_text(addr, len).c_str(), transport_name());
    k = kGs;
  }
  if (k != kGs) return R.connect(fd, addr, len);
  if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
  if (gs_nonblocking(fd)) {
    Inside guard;
    return libc_result(gs_connect(fd, addr, len));
  }
  // Blocking connect: start it non-blocking, then wait in the shim.
  int r;
  {
    Inside guard;
    gs_fcntl(fd, F_SETFL, O_NONBLOCK);
    r = gs_connect(fd, addr, len);
    gs_fcntl(fd, F_SETFL, 0);
  }
  if (r != -EINPROGRESS && r != -EALREADY) return libc_result(r);
  auto info = sock_info(fd);
  const int64_t timeo = info ? info->sndtimeo_us.load() : 0;
  const auto deadline = deadline_for(timeo);
  for (;;) {
    const int w = blocking_wait(fd, POLLOUT, deadline, timeo > 0);
    if (w == -EAGAIN) return libc_result(-EINPROGRESS);  // SO_SNDTIMEO expired, as the kernel reports it
    if (w < 0) return libc_result(w);
    Inside guard;
    sockaddr_storage peer;
    socklen_t pl = sizeof peer;
    if (gs_getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &pl) == 0) return 0;
    int err = 0;
    socklen_t el = sizeof err;
    gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    if (err) return libc_result(-err);
    // Woken without a result yet (a spurious readiness): wait again.
  }
}

GS_EXPORT int accept4(int fd, sockaddr *addr, socklen_t *len, int flags) {
  const Real &R = real();
  if (t_inside || kind_of(fd) != kGs) {
    const int r = R.accept4(fd, addr, len, flags);
    if (r >= 0 && kind_of(fd) == kTransport) mark_transport_fd(r);  // libfabric's own listener
    return r;
  }
  if (FdSlot *s = slot(fd)) s->rgen.fetch_add(1, std::memory_order_relaxed);
  if (!gs_nonblocking(fd)) {  // wait in the shim (signals), then take the connection
    auto info = sock_info(fd);
    const int64_t timeo = info ? info->rcvtimeo_us.load() : 0;
    const auto deadline = deadline_for(timeo);
    int w;
    while ((w = blocking_wait(fd, POLLIN, deadline, timeo > 0)) == 0) {
    }
    if (w < 0) return libc_result(w);
  }
  int r;
  {
    Inside guard;
    r = gs_accept4(fd, addr, len, flags);
  }
  if (r < 0) return libc_result(r);
  attach_gs_fd(r, nullptr);
  log(2, "fd %d: accepted fd %d via gpusock", fd, r);
  return r;
}

GS_EXPORT int accept(int fd, sockaddr *addr, socklen_t *len) {
  if (t_inside || kind_of(fd) != kGs) {
    const int r = real().accept(fd, addr, len);
    if (r >= 0 && kind_of(fd) == kTransport) mark_transport_fd(r);
    return r;
  }
  return accept4(fd, addr, len, 0);
}

// Kernel objects the transport makes for itself are remembered (fork).
GS_EXPORT int socketpair(int domain, int type, int protocol, int sv[2]) {
  const int r = real().socketpair(domain, type, protocol, sv);
  if (r == 0 && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(sv[0]);
    mark_transport_fd(sv[1]);
  }
  return r;
}

GS_EXPORT int eventfd(unsigned initval, int flags) {
  const int fd = real().eventfd(initval, flags);
  if (fd >= 0 && !(flags & EFD_CLOEXEC) && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}

GS_EXPORT int pipe(int fds[2]) {
  const int r = real().pipe(fds);
  if (r == 0 && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(fds[0]);
    mark_transport_fd(fds[1]);
  }
  return r;
}

GS_EXPORT int pipe2(int fds[2], int flags) {
  const int r = real().pipe2(fds, flags);
  if (r == 0 && !(flags & O_CLOEXEC) && transport_caller(__builtin_return_address(0))) {
    mark_transport_fd(fds[0]);
    mark_transport_fd(fds[1]);
  }
  return r;
}

GS_EXPORT int epoll_create(int size) {
  const int fd = real().epoll_create(size);
  if (fd >= 0 && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}

GS_EXPORT int epoll_create1(int flags) {
  const int fd = real().epoll_create1(flags);
  if (fd >= 0 && !(flags & EPOLL_CLOEXEC) && transport_caller(__builtin_return_address(0))) mark_transport_fd(fd);
  return fd;
}

// ------------------------------------------------------------------ data

GS_EXPORT ssize_t read(int fd, void *buf, size_t n) {
  if (t_inside || kind_of(fd) != kGs) return real().read(fd, buf, n);
  iovec iov{buf, n};
  return recv_iov(fd, &iov, 1, 0);
}

GS_EXPORT ssize_t write(int fd, const void *buf, size_t n) {
  if (t_inside || kind_of(fd) != kGs) return real().write(fd, buf, n);
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, 0);
}

GS_EXPORT ssize_t readv(int fd, const iovec *iov, int iovcnt) {
  if (t_inside || kind_of(fd) != kGs) return real().readv(fd, iov, iovcnt);
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return recv_iov(fd, iov, iovcnt, 0);
}

GS_EXPORT ssize_t writev(int fd, const iovec *iov, int iovcnt) {
  if (t_inside || kind_of(fd) != kGs) return real().writev(fd, iov, iovcnt);
  if (iovcnt < 0 || iovcnt > IOV_MAX) {
    errno = EINVAL;
    return -1;
  }
  return send_iov(fd, iov, iovcnt, 0);
}

GS_EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().recv(fd, buf, n, flags);
  iovec iov{buf, n};
  return recv_iov(fd, &iov, 1, flags);
}

GS_EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().send(fd, buf, n, flags);
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, flags);
}

GS_EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags, sockaddr *from, socklen_t *fromlen) {
  if (t_inside || kind_of(fd) != kGs) return real().recvfrom(fd, buf, n, flags, from, fromlen);
  iovec iov{buf, n};
  const ssize_t r = recv_iov(fd, &iov, 1, flags);
  if (r >= 0 && from && fromlen) {
    Inside guard;
    gs_getpeername(fd, from, fromlen);
  }
  return r;
}

GS_EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags, const sockaddr *to, socklen_t tolen) {
  if (t_inside || kind_of(fd) != kGs) return real().sendto(fd, buf, n, flags, to, tolen);
  iovec iov{const_cast<void *>(buf), n};
  return send_iov(fd, &iov, 1, flags);  // connected stream: the address is ignored, as TCP does
}

GS_EXPORT ssize_t recvmsg(int fd, msghdr *msg, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().recvmsg(fd, msg, flags);
  if (!msg) {
    errno = EFAULT;
    return -1;
  }
  const ssize_t r = recv_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
  if (r >= 0) {
    msg->msg_namelen = 0;  // a connected stream fills no source address
    msg->msg_controllen = 0;
    msg->msg_flags = 0;
  }
  return r;
}

GS_EXPORT ssize_t sendmsg(int fd, const msghdr *msg, int flags) {
  if (t_inside || kind_of(fd) != kGs) return real().sendmsg(fd, msg, flags);
  if (!msg) {
    errno = EFAULT;
    return -1;
  }
  if (msg->msg_control && msg->msg_controllen) {
    errno = EOPNOTSUPP;  // no ancillary data on gpusock streams
    return -1;
  }
  return send_iov(fd, msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
}

// sendfile to a gpusock socket: read the file and send it.
GS_EXPORT ssize_t sendfile(int out, int in, off_t *offset, size_t count) {
  const Real &R = real();
  if (t_inside) return R.sendfile(out, in, offset, count);
  if (kind_of(in) == kGs) {
    errno = EINVAL;  // sockets are not a sendfile source
    return -1;
  }
  if (kind_of(out) != kGs) return R.sendfile(out, in, offset, count);
  static thread_local std::vector<char> buf;
  if (buf.empty()) buf.resize(64 * 1024);
  off_t pos = offset ? *offset : 0;
  size_t done = 0;
  while (done < count) {
    const size_t want = std::min(count - done, buf.size());
    const ssize_t got = offset ? pread(in, buf.data(), want, pos) : R.read(in, buf.data(), want);
    if (got < 0) {
      if (done) break;
      return -1;
    }
    if (got == 0) break;
    iovec iov{buf.data(), static_cast<size_t>(got)};
    const ssize_t sent = send_iov(out, &iov, 1, done ? MSG_DONTWAIT : 0);
    if (sent < 0) {
      if (!offset) lseek(in, -got, SEEK_CUR);
      if (done) break;
      return -1;
    }
    if (sent < got && !offset) lseek(in, -(got - sent), SEEK_CUR);
    done += static_cast<size_t>(sent);
    pos += sent;
    if (sent < got) break;
  }
  if (offset) *offset = pos;
  return static_cast<ssize_t>(done);
}

GS_EXPORT ssize_t sendfile64(int out, int in, off_t *offset, size_t count) { return sendfile(out, in, offset, count); }

// Fortified entry points (_FORTIFY_SOURCE builds call these instead).
extern "C" void __chk_fail(void) __attribute__((noreturn));

GS_EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen) {
  if (n > buflen) __chk_fail();
  return read(fd, buf, n);
}

GS_EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags) {
  if (n > buflen) __chk_fail();
  return recv(fd, buf, n, flags);
}

GS_EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen, int flags, sockaddr *from,
                                 socklen_t *fromlen) {
  if (n > buflen) __chk_fail();
  return recvfrom(fd, buf, n, flags, from, fromlen);
}

// ------------------------------------------------------------------ control

GS_EXPORT int shutdown(int fd, int how) {
  if (t_inside || kind_of(fd) != kGs) return real().shutdown(fd, how);
  Inside guard;
  return libc_result(gs_shutdown(fd, how));
}

GS_EXPORT int getsockname(int fd, sockaddr *addr, socklen_t *len) {
  if (t_inside || kind_of(fd) != kGs) return real().getsockname(fd, addr, len);
  Inside guard;
  return libc_result(gs_getsockname(fd, addr, len));
}

GS_EXPORT int getpeername(int fd, sockaddr *addr, socklen_t *len) {
  if (t_inside || kind_of(fd) != kGs) return real().getpeername(fd, addr, len);
  Inside guard;
  return libc_result(gs_getpeername(fd, addr, len));
}

namespace {

// Kernel TCP options with no meaning on gpusock: accepted and ignored, so
// programs that tune them keep working.
bool harmless_option(int level, int name) {
  switch (level) {
    case SOL_SOCKET:
      return name == SO_DONTROUTE || name == SO_MARK || name == SO_BINDTODEVICE || name == SO_BUSY_POLL ||
             name == SO_ZEROCOPY || name == SO_MAX_PACING_RATE || name == SO_INCOMING_CPU || name == SO_TIMESTAMP ||
             name == SO_TIMESTAMPNS || name == SO_PASSCRED || name == SO_BROADCAST;
    case IPPROTO_TCP:
      return name == TCP_DEFER_ACCEPT || name == TCP_FASTOPEN || name == TCP_FASTOPEN_CONNECT ||
             name == TCP_USER_TIMEOUT || name == TCP_CONGESTION || name == TCP_NOTSENT_LOWAT ||
             name == TCP_WINDOW_CLAMP || name == TCP_SYNCNT || name == TCP_LINGER2 || name == TCP_THIN_LINEAR_TIMEOUTS ||
             name == TCP_SAVE_SYN;
    case IPPROTO_IP:
      return name == IP_TTL || name == IP_BIND_ADDRESS_NO_PORT || name == IP_FREEBIND || name == IP_TRANSPARENT ||
             name == IP_MTU_DISCOVER || name == IP_RECVERR;
    case IPPROTO_IPV6:
      return name == IPV6_TCLASS || name == IPV6_RECVERR || name == IPV6_MTU_DISCOVER;
    default:
      return false;
  }
}

}  // namespace

GS_EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
  const Real &R = real();
  if (t_inside) return R.setsockopt(fd, level, name, val, len);
  const uint8_t k = kind_of(fd);
  if (k == kPending) {
    int r = 0;
    if (level != SOL_RDMA) r = R.setsockopt(fd, level, name, val, len);
    if (r == 0 && val) {
      std::lock_guard lock(fd_mu());
      auto it = pendings().find(fd);
      if (it != pendings().end()) {
        Pending::Opt o{level, name, std::vector<char>(static_cast<const char *>(val), static_cast<const char *>(val) + len)};
        it->second.opts.push_back(std::move(o));
      }
    }
    return r;
  }
  if (k != kGs) return R.setsockopt(fd, level, name, val, len);
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (!val || len < sizeof(timeval)) {
      errno = EINVAL;
      return -1;
    }
    note_timeout(fd, name, val, len);
    return 0;
  }
  int optname = name;
  if (level == SOL_SOCKET && name == SO_RCVBUFFORCE) optname = SO_RCVBUF;
  if (level == SOL_SOCKET && name == SO_SNDBUFFORCE) optname = SO_SNDBUF;
  Inside guard;
  const int r = gs_setsockopt(fd, level, optname, val, len);
  if (r == -ENOPROTOOPT && harmless_option(level, name)) return 0;
  return libc_result(r);
}

GS_EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
  const Real &R = real();
  if (t_inside || kind_of(fd) != kGs) return R.getsockopt(fd, level, name, val, len);
  if (level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (!val || !len || *len < sizeof(timeval)) {
      errno = EINVAL;
      return -1;
    }
    auto info = sock_info(fd);
    const int64_t us = info ? (name == SO_RCVTIMEO ? info->rcvtimeo_us : info->sndtimeo_us).load() : 0;
    timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
    std::memcpy(val, &tv, sizeof tv);
    *len = sizeof tv;
    return 0;
  }
  if (level == IPPROTO_TCP && name == TCP_INFO) {
    // No kernel TCP state exists; report the connection state and nothing else.
    if (!val || !len) {
      errno = EFAULT;
      return -1;
    }
    tcp_info ti{};
    sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    auto info = sock_info(fd);
    Inside guard;
    if (info && info->listening) ti.tcpi_state = TCP_LISTEN;
    else ti.tcpi_state = gs_getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &sl) == 0 ? TCP_ESTABLISHED : TCP_CLOSE;
    const socklen_t n = std::min<socklen_t>(*len, sizeof ti);
    std::memcpy(val, &ti, n);
    *len = n;
    return 0;
  }
  if (level == IPPROTO_TCP && name == TCP_CONGESTION) {
    if (!val || !len) {
      errno = EFAULT;
      return -1;
    }
    const char name_text[] = "gpusock";
    const socklen_t n = std::min<socklen_t>(*len, sizeof name_text);
    std::memcpy(val, name_text, n);
    *len = n;
    return 0;
  }
  Inside guard;
  return libc_result(gs_getsockopt(fd, level, name, val, len));
}

// ------------------------------------------------------------------ fds

GS_EXPORT int close(int fd) {
  const Real &R = real();
  if (t_inside) {
    if (fd == t_skip_close) {
      t_skip_close = -1;
      return 0;
    }
    if (kind_of(fd) == kTransport) set_kind(fd, kKernel);
    return R.close(fd);
  }
  switch (kind_of(fd)) {
    case kGs: {
      epoll_forget_fd(fd);
      detach_gs_fd(fd);
      Inside guard;
      return libc_result(gs_close(fd));
    }
    case kPending:
      finalize_kernel(fd);
      return R.close(fd);
    case kEpoll:
      epoll_forget_epfd(fd);
      set_kind(fd, kKernel);
      return R.close(fd);
    case kTransport:
      set_kind(fd, kKernel);
      return R.close(fd);
    default:
      return R.close(fd);
  }
}

GS_EXPORT int close_range(unsigned first, unsigned last, int flags) {
  const Real &R = real();
  if (!R.close_range) {
    errno = ENOSYS;
    return -1;
  }
  if (t_inside || (flags & CLOSE_RANGE_CLOEXEC)) return R.close_range(first, last, flags);
  std::vector<int> ours;
  for (auto &[fd, info] : all_gs_fds())
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) ours.push_back(fd);
  for (int fd : ours) close(fd);
  // Pending and epoll fds: drop the shim's state; the kernel closes them below.
  const unsigned top = std::min<unsigned>(last, kMaxChunks * kChunk - 1);
  for (unsigned fd = first; fd <= top; ++fd) {
    if (!slot(static_cast<int>(fd))) {
      fd |= kChunk - 1;  // no chunk: skip it
      continue;
    }
    const uint8_t k = kind_of(static_cast<int>(fd));
    if (k == kPending || k == kEpoll) drop_fd_state(static_cast<int>(fd));
  }
  return R.close_range(first, last, flags);
}

GS_EXPORT void closefrom(int lowfd) {
  if (lowfd < 0) lowfd = 0;
  if (close_range(static_cast<unsigned>(lowfd), ~0u, 0) < 0) {
    const int top = static_cast<int>(sysconf(_SC_OPEN_MAX));
    for (int fd = lowfd; fd < top; ++fd) close(fd);
  }
}

GS_EXPORT int dup(int fd) {
  const Real &R = real();
  if (t_inside) return R.dup(fd);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    int r;
    {
      Inside guard;
      r = gs_dup(fd);
    }
    if (r < 0) return libc_result(r);
    attach_gs_fd(r, sock_info(fd));
    return r;
  }
  const int r = R.dup(fd);
  if (r >= 0 && k == kEpoll) epoll_dup_epfd(fd, r);
  return r;
}

namespace {

int dup_common(int oldfd, int newfd, int flags, bool is_dup3) {
  const Real &R = real();
  const uint8_t k = kind_of(oldfd);
  if (oldfd == newfd) {
    if (is_dup3) {
      errno = EINVAL;
      return -1;
    }
    return R.fcntl(oldfd, F_GETFD) < 0 ? -1 : newfd;
  }
  if (k == kGs) {
    if (R.fcntl(oldfd, F_GETFD) < 0) return -1;
    auto info = sock_info(oldfd);
    drop_fd_state(newfd);  // a gpusock target is released by the library's dup itself
    int r;
    {
      Inside guard;
      r = gs_dup3(oldfd, newfd, flags);
    }
    if (r < 0) return libc_result(r);
    attach_gs_fd(newfd, info);
    return newfd;
  }
  if (R.fcntl(oldfd, F_GETFD) < 0) return -1;  // EBADF before touching newfd
  release_gs_target(newfd);
  const int r = is_dup3 ? R.dup3(oldfd, newfd, flags) : R.dup2(oldfd, newfd);
  if (r >= 0 && k == kEpoll) epoll_dup_epfd(oldfd, newfd);
  return r;
}

}  // namespace

GS_EXPORT int dup2(int oldfd, int newfd) {
  if (t_inside) return real().dup2(oldfd, newfd);
  return dup_common(oldfd, newfd, 0, false);
}

GS_EXPORT int dup3(int oldfd, int newfd, int flags) {
  if (t_inside) return real().dup3(oldfd, newfd, flags);
  return dup_common(oldfd, newfd, flags, true);
}

namespace {

int fcntl_common(int fd, int cmd, void *arg) {
  const Real &R = real();
  if (t_inside) return R.fcntl(fd, cmd, arg);
  const uint8_t k = kind_of(fd);
  if (k == kGs) {
    const long v = reinterpret_cast<long>(arg);
    switch (cmd) {
      case F_GETFL:
      case F_GETFD:
      case F_SETFD: {
        Inside guard;
        return libc_result(gs_fcntl(fd, cmd, v));
      }
      case F_SETFL: {
        if (FdSlot *s = slot(fd)) s->wgen.fetch_add(1, std::memory_order_relaxed);
        Inside guard;
        return libc_result(gs_fcntl(fd, cmd, v & O_NONBLOCK));
      }
      case F_DUPFD:
      case F_DUPFD_CLOEXEC: {
        // The kernel picks the number (>= arg); the library then adopts it.
        const int n = R.fcntl(fd, cmd, arg);
        if (n < 0) return n;
        int r;
        {
          Inside guard;
          r = gs_dup3(fd, n, cmd == F_DUPFD_CLOEXEC ? O_CLOEXEC : 0);
        }
        if (r < 0) {
          R.close(n);
          return libc_result(r);
        }
        attach_gs_fd(n, sock_info(fd));
        return n;
      }
      default:
        return R.fcntl(fd, cmd, arg);  // F_SETOWN, locks...: the reserved fd answers
    }
  }
  const int r = R.fcntl(fd, cmd, arg);
  if (r >= 0 && k == kEpoll && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) epoll_dup_epfd(fd, r);
  return r;
}

}  // namespace

GS_EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  return fcntl_common(fd, cmd, arg);
}

GS_EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  return fcntl_common(fd, cmd, arg);
}

GS_EXPORT int ioctl(int fd, unsigned long req, ...) {
  va_list ap;
  va_start(ap, req);
  void *arg = va_arg(ap, void *);
  va_end(ap);
  const Real &R = real();
  if (t_inside || kind_of(fd) != kGs) return R.ioctl(fd, req, arg);
  switch (req) {
    case FIONBIO: {
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      Inside guard;
      return libc_result(gs_fcntl(fd, F_SETFL, *static_cast<int *>(arg) ? O_NONBLOCK : 0));
    }
    case FIONREAD: {
      // Bytes ready to read: peek them (the library keeps no separate count).
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      Inside guard;
      int ring = 0;
      socklen_t rl = sizeof ring;
      if (gs_getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &ring, &rl) < 0 || ring <= 0) ring = 1 << 20;
      static thread_local std::vector<char> buf;
      if (buf.size() < static_cast<size_t>(ring)) buf.resize(static_cast<size_t>(ring));
      ssize_t n = gs_recv(fd, buf.data(), static_cast<size_t>(ring), MSG_PEEK | MSG_DONTWAIT);
      if (n == -EAGAIN || n == -ENOTCONN) n = 0;
      if (n < 0) return libc_result<int>(static_cast<int>(n));
      *static_cast<int *>(arg) = static_cast<int>(n);
      return 0;
    }
    case SIOCOUTQ:
    case SIOCATMARK:
      if (!arg) {
        errno = EFAULT;
        return -1;
      }
      *static_cast<int *>(arg) = 0;
      return 0;
    default:
      if ((req & 0xff00) == 0x8900) {  // SIOCGIF* and friends: ask a kernel socket
        const int tmp = R.socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (tmp < 0) return -1;
        const int r = R.ioctl(tmp, req, arg);
        const int saved = errno;
        R.close(tmp);
        errno = saved;
        return r;
      }
      errno = ENOTTY;
      return -1;
  }
}

// fstat: a gpusock fd is a socket (its reserved kernel object is an eventfd).
GS_EXPORT int fstat(int fd, struct stat *st) {
  const int r = real().fstat(fd, st);
  if (r == 0 && !t_inside && kind_of(fd) == kGs) st->st_mode = S_IFSOCK | 0777;
  return r;
}

GS_EXPORT int fstat64(int fd, struct stat64 *st) { return fstat(fd, reinterpret_cast<struct stat *>(st)); }
