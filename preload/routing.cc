// Routing between the kernel and gpusock (routing.h).
#include "preload/routing.h"
#include "wire/config.h"
#include "wire/log.h"

#include "preload/library.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <mutex>

namespace gpusock::preload {

thread_local int t_skip_close __attribute__((tls_model("initial-exec"))) = -1;

// ------------------------------------------------------------------ whose call, which socket

bool called_from_transport(void *ret) {
  Dl_info info;
  if (!dladdr(ret, &info) || !info.dli_fname) return false;
  const char *f = info.dli_fname;
  return strstr(f, "libfabric") || strstr(f, "libgpusock.so") || strstr(f, "librdmacm") || strstr(f, "libibverbs") ||
         strstr(f, "libefa") || strstr(f, "libpsm") || strstr(f, "rdmav");
}

bool transport_caller(void *ret) { return t_inside || called_from_transport(ret); }

bool intercept_candidate(int domain, int type, int protocol) {
  if (!config().enabled) return false;
  if (domain != AF_INET && domain != AF_INET6) return false;
  if ((type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC)) != SOCK_STREAM) return false;
  if (protocol != 0 && protocol != IPPROTO_TCP) return false;
  return rules_select(domain, type, protocol);
}

namespace {

// Can this process create gpusock sockets? Probed once (a gs_socket that is
// closed again); the answer and the library's explanation are kept.
std::mutex g_probe_mu;
std::atomic<int> g_probe{1};  // 1 unknown, 0 usable, < 0 the error
char g_probe_error[256];

}  // namespace

int probe_transport() {
  const int known = g_probe.load(std::memory_order_acquire);
  if (known <= 0) return known;
  std::lock_guard lock(g_probe_mu);
  if (g_probe.load() <= 0) return g_probe.load();
  if (const int loaded = load_library(); loaded < 0) {
    snprintf(g_probe_error, sizeof g_probe_error, "%s", load_error());
    g_probe.store(loaded, std::memory_order_release);
    return loaded;
  }
  Inside guard;
  const int fd = gs().socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    snprintf(g_probe_error, sizeof g_probe_error, "%s", gs().last_error());
    if (!g_probe_error[0]) snprintf(g_probe_error, sizeof g_probe_error, "%s", strerror(-fd));
    g_probe.store(fd, std::memory_order_release);
  } else {
    gs().close(fd);
    g_probe.store(0, std::memory_order_release);
  }
  return g_probe.load();
}

const char *probe_error() { return g_probe_error; }

int transport_or_fallback() {
  const int st = probe_transport();
  if (st == 0) return 0;
  static std::atomic<bool> warned{false};
  if (config().refuse) {
    if (!warned.exchange(true))
      log::write(log::kWarn, "shim", "refusing TCP sockets (GPUSOCK_FALLBACK=refuse): %s", probe_error());
    return st;
  }
  if (!warned.exchange(true))
    log::write(log::kWarn, "shim",
               "%s; falling back to kernel TCP for this process (GPUSOCK_FALLBACK=refuse to fail instead)",
               probe_error());
  return 1;
}

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
  else inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(addr)->sin6_addr, host, sizeof host);
  char out[INET6_ADDRSTRLEN + 16];
  snprintf(out, sizeof out, addr->sa_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host, port);
  return out;
}

const char *transport_name() {
  // Read once: some servers clear their workers' environment (nginx).
  static const std::string name = [] {
    const std::string &t = config::text(config::Id::kTransport);
    return t.empty() ? std::string("default transport") : t;
  }();
  return name.c_str();
}

// ------------------------------------------------------------------ the decision

int new_gs_socket(int domain, bool nonblocking, const std::vector<Pending::Opt> &opts) {
  Inside guard;
  const int fd = gs().socket(domain, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return fd;
  const Config &c = config();
  if (c.iomap_size >= 0) gs().setsockopt(fd, SOL_RDMA, RDMA_IOMAPSIZE, &c.iomap_size, sizeof(int));
  for (const auto &o : opts) {
    if (o.level == SOL_SOCKET && (o.name == SO_RCVTIMEO || o.name == SO_SNDTIMEO)) continue;
    gs().setsockopt(fd, o.level, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
  }
  return fd;
}

void note_timeouts(int fd, const std::vector<Pending::Opt> &opts) {
  for (const auto &o : opts)
    if (o.level == SOL_SOCKET && (o.name == SO_RCVTIMEO || o.name == SO_SNDTIMEO))
      note_timeout(fd, o.name, o.value.data(), static_cast<socklen_t>(o.value.size()));
}

namespace {

// Replaces the pending kernel socket fd by a gpusock socket on the same number.
// Returns 0 or a negated errno (the kernel socket is then left as it was).
int upgrade(int fd, const Pending &p) {
  const Real &R = real();
  const int fl = R.fcntl(fd, F_GETFL);
  const int fdfl = R.fcntl(fd, F_GETFD);
  if (fl < 0 || fdfl < 0) return -errno;
  Inside guard;
  const int tmp = new_gs_socket(p.domain, fl & O_NONBLOCK, p.opts);
  if (tmp < 0) return tmp;
  const int r = gs().dup3(tmp, fd, (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0);
  gs().close(tmp);
  if (r < 0) return r;
  auto info = std::make_shared<SockInfo>();
  info->spec = std::make_shared<ListenSpec>();  // filled in should it listen (listeners.h)
  info->spec->domain = p.domain;
  info->spec->opts = p.opts;
  attach_gs_fd(fd, info);
  note_timeouts(fd, p.opts);
  epoll_upgrade_fd(fd);
  return 0;
}

}  // namespace

int decide_pending(int fd, const Pending &p, uint16_t port, const std::string &what) {
  if (!port_selected(port)) {
    log::write(log::kInfo, "shim", "fd %d: %s: kernel TCP (port not selected)", fd, what.c_str());
    finalize_kernel(fd);
    return 0;
  }
  if (const int st = transport_or_fallback(); st != 0) {
    finalize_kernel(fd);
    if (st > 0) return 0;
    errno = -st;
    return -1;
  }
  if (int r = upgrade(fd, p); r < 0) {
    errno = -r;
    return -1;
  }
  return 1;
}

void finalize_kernel(int fd) {
  drop_pending(fd);
  epoll_forget_fd(fd);
}

void bind_recorded(int fd, const Pending &p) {
  if (!p.bound_len) return;
  Inside guard;
  gs().bind(fd, reinterpret_cast<const sockaddr *>(&p.bound), p.bound_len);
}

void note_timeout(int fd, int name, const void *val, socklen_t len) {
  if (!val || len < sizeof(timeval)) return;
  const auto *tv = static_cast<const timeval *>(val);
  const int64_t us = static_cast<int64_t>(tv->tv_sec) * 1000000 + tv->tv_usec;
  auto info = sock_info(fd);
  if (!info) return;
  (name == SO_RCVTIMEO ? info->rcvtimeo_us : info->sndtimeo_us).store(us < 0 ? 0 : us);
}

// ------------------------------------------------------------------ leaving the tables

uint8_t drop_fd_state(int fd) {
  const uint8_t kind = kind_of(fd);
  switch (kind) {
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
    case kDormant:
      epoll_forget_fd(fd);
      drop_dormant(fd);
      break;
    default:
      break;
  }
  return kind;
}

// If newfd is a gpusock socket the library must forget it without closing the
// number, so the replacement stays atomic.
void release_gs_target(int newfd) {
  if (drop_fd_state(newfd) != kGs) return;
  Inside guard;
  t_skip_close = newfd;
  gs().close(newfd);
  t_skip_close = -1;
}

int close_fd(int fd) {
  if (drop_fd_state(fd) == kGs) {
    Inside guard;
    return libc_result(gs().close(fd));
  }
  return real().close(fd);
}

}  // namespace gpusock::preload
