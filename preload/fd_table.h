// The shim's per-fd state: what each fd number is (the kernel's, a pending TCP
// socket, a gpusock socket, an emulated epoll fd, the shim's own, the
// transport's), the state shared by every fd of one gpusock socket, the
// recorded options of pending sockets, and the kernel fds the transport made
// for itself. State only: the decisions that change it are routing.h's.
#pragma once

#include "preload/libc.h"

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace gpusock::preload {

enum Kind : uint8_t {
  kKernel = 0,     // not ours: libc handles it
  kPending = 1,    // a kernel TCP socket that may still become a gpusock socket
  kGs = 2,         // a gpusock socket (the fd is the library's reserved eventfd)
  kEpoll = 3,      // an epoll fd the shim emulates for gpusock members
  kInternal = 4,   // a gpusock fd the shim holds for itself (fork relays)
  kTransport = 5,  // a kernel fd gpusock or libfabric made for themselves
  kDormant = 6     // a listener without a gpusock listener in this process yet (listeners.h)
};

struct FdSlot {
  std::atomic<uint8_t> kind{kKernel};
  // Bumped by every receive- (send-) side call, so edge-triggered epoll can
  // report again once the application has read (written) since the last report.
  std::atomic<uint32_t> rgen{0};
  std::atomic<uint32_t> wgen{0};
  // Bumped by receive calls and by waits for readability: a fork relay passes
  // incoming data to the child only while the parent leaves the socket alone.
  std::atomic<uint32_t> rtouch{0};
  std::atomic<uint64_t> ino{0};  // kTransport: the file's inode, to know it is still the same file
  // Threads blocked in accept() on it, or in poll/select with it (listeners.h:
  // a listener waited on is in use, also when a signal handler forks meanwhile).
  std::atomic<uint16_t> waiters{0};
};

// The slot of fd (nullptr for fds beyond the table); create makes its chunk.
FdSlot *slot(int fd, bool create = false);
inline uint8_t kind_of(int fd) {
  FdSlot *s = slot(fd);
  return s ? s->kind.load(std::memory_order_acquire) : static_cast<uint8_t>(kKernel);
}
inline bool is_gs(int fd) { return kind_of(fd) == kGs; }
inline void touch_read(int fd) {
  if (FdSlot *s = slot(fd)) s->rtouch.fetch_add(1, std::memory_order_relaxed);
}
void set_kind(int fd, uint8_t kind);
// A wait on fd begins / ends (FdSlot::waiters); the end never goes below 0 (a
// child of fork() starts from 0 while its copy of the wait may still end).
inline void waiter_enter(int fd) {
  if (FdSlot *s = slot(fd)) s->waiters.fetch_add(1);
}
inline void waiter_leave(int fd) {
  FdSlot *s = slot(fd);
  if (!s) return;
  uint16_t n = s->waiters.load();
  while (n > 0 && !s->waiters.compare_exchange_weak(n, static_cast<uint16_t>(n - 1))) {}
}
// Calls f for every fd in [first, last] that has a slot, in order.
void for_each_slot(unsigned first, unsigned last, const std::function<void(int fd, FdSlot &s)> &f);

// ------------------------------------------------------------------ gpusock sockets

struct ListenSpec;

// Shim-level state shared by every fd of one gpusock socket (dup, fork relay).
struct SockInfo {
  std::atomic<int> user_fds{0};         // application-visible fds
  std::atomic<int64_t> rcvtimeo_us{0};  // SO_RCVTIMEO / SO_SNDTIMEO (emulated)
  std::atomic<int64_t> sndtimeo_us{0};
  std::atomic<bool> listening{false};
  std::shared_ptr<ListenSpec> spec;  // a listener: how to make it again in another process (set at listen)
};
std::shared_ptr<SockInfo> sock_info(int fd);
void attach_gs_fd(int fd, std::shared_ptr<SockInfo> info);  // marks fd kGs
// Forgets fd's gpusock state (not the fd). Returns the info it had.
std::shared_ptr<SockInfo> detach_gs_fd(int fd);
// Every application-visible gpusock fd (for fork and exec).
std::vector<std::pair<int, std::shared_ptr<SockInfo>>> all_gs_fds();
void forget_all_gs_fds_in_child();

// ------------------------------------------------------------------ pending sockets

// A TCP socket still undecided: what bind/listen/connect need to replay on a
// gpusock socket if its port is selected.
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
void add_pending(int fd, int domain);     // marks fd kPending
bool take_pending(int fd, Pending *out);  // a copy; false if fd is not pending
void set_pending_bound(int fd, const sockaddr_storage &addr, socklen_t len);
void record_pending_option(int fd, int level, int name, const void *val, socklen_t len);
void drop_pending(int fd);  // marks fd kKernel

// ------------------------------------------------------------------ listeners

// What makes a listener again in another process of a forked server, or in
// this one after it has set its own aside (listeners.h). Shared by every fd of
// the listener; guarded by `mu`.
struct ListenSpec {
  std::mutex mu;
  int domain = AF_INET;
  sockaddr_storage addr{};  // the address it listens on, with the port it got
  socklen_t addr_len = 0;
  int backlog = 128;
  std::vector<Pending::Opt> opts;  // options set before listen(), replayed on a new listener
  int v6only = -1;                 // IPV6_V6ONLY as set (-1: the system default)
  int anchor = -1;                 // fabric:tcp: this process's fd of the kernel listening socket the processes share
  uint32_t touch_mark = 0;         // the listener's rtouch when last judged (listen, fork)
  int64_t retry_ns = 0;            // dormant with the port held elsewhere: when to try again
  bool told_busy = false;          // the log said why this process waits
  ListenSpec() = default;
  ListenSpec(const ListenSpec &) = delete;
  ListenSpec &operator=(const ListenSpec &) = delete;
  ~ListenSpec();  // closes the anchor
};
// fd is a dormant listener (kDormant) of `spec`; nullptr when it is not one.
void add_dormant(int fd, std::shared_ptr<ListenSpec> spec);
std::shared_ptr<ListenSpec> dormant_spec(int fd);
// Forgets a dormant fd (and marks it kKernel unless keep_kind); returns its spec.
std::shared_ptr<ListenSpec> drop_dormant(int fd, bool keep_kind = false);
std::vector<std::pair<int, std::shared_ptr<ListenSpec>>> all_dormant();

// ------------------------------------------------------------------ transport fds

// Kernel fds the transport creates for itself (libfabric's sockets, epoll
// sets, eventfds): remembered so a forked child can close them at exec.
void mark_transport_fd(int fd);
void transport_fds_cloexec_in_child();

std::mutex &fd_table_mutex();  // sockets' and pending sockets' tables (held across fork)

}  // namespace gpusock::preload
