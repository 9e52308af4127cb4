// The fork relays and their thread (relay.h).
#include "preload/relay.h"
#include "wire/log.h"

#include "preload/config.h"
#include "preload/library.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <thread>

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
  std::vector<char> c2g, g2c;     // bytes not yet passed on
  size_t c2g_off = 0, g2c_off = 0;
  bool c2g_pending() const { return c2g_off < c2g.size(); }
  bool g2c_pending() const { return g2c_off < g2c.size(); }
};

struct Relays {
  std::mutex mu;
  std::vector<Relay *> list;
};

// Never destroyed: the relay thread may run after static destructors.
Relays &relays_state() {
  static auto *r = new Relays();
  return *r;
}
std::mutex &relay_mu() { return relays_state().mu; }
std::vector<Relay *> &relays() { return relays_state().list; }
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
      else if (!x.gs_broken) gs().shutdown(x.g, SHUT_WR);
    } else if (errno != EAGAIN && errno != EINTR) {
      x.c2g_eof = x.child_gone = true;
    }
  }
  if (x.c2g_pending() && !x.gs_broken) {
    const ssize_t s = gs().send(x.g, x.c2g.data() + x.c2g_off, x.c2g.size() - x.c2g_off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (s > 0) x.c2g_off += static_cast<size_t>(s);
    else if (s != -EAGAIN && s != -EINTR) x.gs_broken = true;
  }
  if (x.gs_broken) x.c2g_off = x.c2g.size();
  // gpusock -> child
  if (to_child && !x.g2c_eof && !x.g2c_pending() && !x.child_gone && !x.child_unwritable) {
    const ssize_t n = gs().recv(x.g, buf, kRelayChunk, MSG_DONTWAIT);
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
    gs().poll(p.data(), p.size(), 20);
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
      log::write(log::kDebug, "shim", "fork relay for fd %d finished", x->g);
      real().close(x->r);
      set_kind(x->g, kKernel);
      gs().close(x->g);  // drops the relay's reference; the last one closes the connection
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

std::mutex &relay_mutex() { return relay_mu(); }

std::vector<int> relay_fds_locked() {
  std::vector<int> fds;
  for (Relay *x : relays()) {
    fds.push_back(x->r);
    fds.push_back(x->g);
  }
  return fds;
}

void add_relay_locked(int r, int g, std::shared_ptr<SockInfo> info, std::vector<int> parent_fds) {
  auto *x = new Relay();
  x->r = r;
  x->g = g;
  x->info = std::move(info);
  x->parent_fds = std::move(parent_fds);
  x->touch_sum = parent_touches(*x);
  x->touch_changed = std::chrono::steady_clock::now();
  relays().push_back(x);
}

void run_relays_locked() {
  if (relays().empty()) return;
  start_relay_thread_locked();
  wake_relays();
}

void relay_after_fork_child() {
  // The relay thread and its work belong to the parent; the child closes its
  // copies of the relay fds (done by the caller) and starts empty.
  new (&relay_mu()) std::mutex();
  relays().clear();  // the objects are the parent's business (leaked copies)
  if (g_relay_wake >= 0) real().close(g_relay_wake);
  g_relay_wake = -1;
  g_relay_thread = false;
}

}  // namespace gpusock::preload
