// libgpusock_preload.so internals: the libc entry points we forward to, the
// per-fd table, the recursion guard and the shared helpers of the shim's
// translation units. See docs/preload.md for the design.
#pragma once

#include <gpusock/socket.h>

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace gpusock::preload {

// ------------------------------------------------------------------ libc

// The next definition of each interposed function (libc's), resolved once.
struct Real {
  int (*socket)(int, int, int);
  int (*socketpair)(int, int, int, int *);
  int (*bind)(int, const sockaddr *, socklen_t);
  int (*listen)(int, int);
  int (*accept)(int, sockaddr *, socklen_t *);
  int (*accept4)(int, sockaddr *, socklen_t *, int);
  int (*connect)(int, const sockaddr *, socklen_t);
  ssize_t (*read)(int, void *, size_t);
  ssize_t (*write)(int, const void *, size_t);
  ssize_t (*readv)(int, const iovec *, int);
  ssize_t (*writev)(int, const iovec *, int);
  ssize_t (*recv)(int, void *, size_t, int);
  ssize_t (*send)(int, const void *, size_t, int);
  ssize_t (*recvfrom)(int, void *, size_t, int, sockaddr *, socklen_t *);
  ssize_t (*sendto)(int, const void *, size_t, int, const sockaddr *, socklen_t);
  ssize_t (*recvmsg)(int, msghdr *, int);
  ssize_t (*sendmsg)(int, const msghdr *, int);
  ssize_t (*sendfile)(int, int, off_t *, size_t);
  int (*poll)(pollfd *, nfds_t, int);
  int (*ppoll)(pollfd *, nfds_t, const timespec *, const sigset_t *);
  int (*select)(int, fd_set *, fd_set *, fd_set *, timeval *);
  int (*pselect)(int, fd_set *, fd_set *, fd_set *, const timespec *, const sigset_t *);
  int (*epoll_create)(int);
  int (*epoll_create1)(int);
  int (*epoll_ctl)(int, int, int, epoll_event *);
  int (*epoll_wait)(int, epoll_event *, int, int);
  int (*epoll_pwait)(int, epoll_event *, int, int, const sigset_t *);
  int (*epoll_pwait2)(int, epoll_event *, int, const timespec *, const sigset_t *);
  int (*fcntl)(int, int, ...);
  int (*ioctl)(int, unsigned long, ...);
  int (*setsockopt)(int, int, int, const void *, socklen_t);
  int (*getsockopt)(int, int, int, void *, socklen_t *);
  int (*getsockname)(int, sockaddr *, socklen_t *);
  int (*getpeername)(int, sockaddr *, socklen_t *);
  int (*shutdown)(int, int);
  int (*close)(int);
  int (*close_range)(unsigned, unsigned, int);
  int (*dup)(int);
  int (*dup2)(int, int);
  int (*dup3)(int, int, int);
  pid_t (*fork)();
  int (*execve)(const char *, char *const[], char *const[]);
  int (*execveat)(int, const char *, char *const[], char *const[], int);
  int (*fexecve)(int, char *const[], char *const[]);
  int (*execvpe)(const char *, char *const[], char *const[]);
  int (*fstat)(int, struct stat *);
  int (*sigaction)(int, const struct sigaction *, struct sigaction *);
  int (*eventfd)(unsigned, int);
  int (*pipe)(int *);
  int (*pipe2)(int *, int);
};
const Real &real();

// ------------------------------------------------------------------ guard

// Set while the shim runs library code on this thread: gpusock and libfabric
// call close/poll/fcntl/dup3/socket themselves, and those calls must reach libc.
extern thread_local int t_inside __attribute__((tls_model("initial-exec")));
struct Inside {
  Inside() { ++t_inside; }
  ~Inside() { --t_inside; }
  Inside(const Inside &) = delete;
  Inside &operator=(const Inside &) = delete;
};

// ------------------------------------------------------------------ fd table

enum Kind : uint8_t {
  kKernel = 0,   // not ours: libc handles it
  kPending = 1,  // a kernel TCP socket that may still become a gpusock socket
  kGs = 2,       // a gpusock socket (the fd is the library's reserved eventfd)
  kEpoll = 3,    // an epoll fd the shim emulates for gpusock members
  kInternal = 4,  // a gpusock fd the shim holds for itself (fork relays)
  kTransport = 5  // a kernel fd gpusock or libfabric made for themselves
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
};
inline void touch_read(int fd);

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

// Shim-level state shared by every fd of one gpusock socket (dup, fork relay).
struct SockInfo {
  std::atomic<int> user_fds{0};  // application-visible fds
  std::atomic<int64_t> rcvtimeo_us{0};  // SO_RCVTIMEO / SO_SNDTIMEO (emulated)
  std::atomic<int64_t> sndtimeo_us{0};
  std::atomic<bool> listening{false};
};
std::shared_ptr<SockInfo> sock_info(int fd);
void attach_gs_fd(int fd, std::shared_ptr<SockInfo> info);  // marks fd kGs
// Forgets fd's gpusock state (not the fd). Returns the info it had.
std::shared_ptr<SockInfo> detach_gs_fd(int fd);
// Every application-visible gpusock fd (for fork and exec).
std::vector<std::pair<int, std::shared_ptr<SockInfo>>> all_gs_fds();
void forget_all_gs_fds_in_child();
// Kernel fds the transport creates for itself (libfabric's sockets, epoll
// sets, eventfds): remembered so a forked child can close them at exec.
bool transport_caller(void *ret);
void mark_transport_fd(int fd);
void transport_fds_cloexec_in_child();
std::mutex &fd_table_mutex();     // pending/info tables
std::mutex &epoll_table_mutex();  // epoll side tables

// ------------------------------------------------------------------ config

struct Config {
  bool enabled = true;
  bool refuse = false;  // GPUSOCK_FALLBACK=refuse
  int log_level = 0;    // 0 warn, 1 info, 2 debug
  bool have_include = false;
  std::vector<uint64_t> include;  // 65536-bit maps
  std::vector<uint64_t> exclude;
  int busy_poll_us = 200;
  int iomap_size = -1;  // rsocket iomap_size (applied per socket)
  struct Rule {
    std::string program;  // prefix, "*" for any
    int domain = -1, type = -1, protocol = -1;  // -1 any
  };
  std::vector<Rule> rules;  // preload_config; empty = intercept everything
};
const Config &config();
void init_config();  // idempotent; the constructor calls it
bool port_selected(uint16_t port);
bool rules_select(int domain, int type, int protocol);

void log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// ------------------------------------------------------------------ helpers

// Runs a gs_* call under the guard and converts its status to the libc
// convention (-1 and errno).
template <class T>
inline T libc_result(T status) {
  if (status < 0) {
    errno = static_cast<int>(-status);
    return -1;
  }
  return status;
}

// Signals: a counter bumped by the shim's handler trampoline, so emulated waits
// notice a handled signal that arrived while they were spinning, and whether
// that handler asked for SA_RESTART.
extern thread_local unsigned t_signals __attribute__((tls_model("initial-exec")));
extern thread_local int t_signal_restart __attribute__((tls_model("initial-exec")));

// Emulated multiplexing: poll over a mix of gpusock and kernel fds with a
// timespec timeout (nullptr: forever) and an optional signal mask for the
// sleeps. Returns the count, 0 on timeout, or -1 with errno.
int emulated_poll(pollfd *fds, nfds_t nfds, const timespec *timeout, const sigset_t *sigmask);

// Epoll bookkeeping the socket calls need.
void epoll_forget_fd(int fd);              // close of a gpusock or pending fd
void epoll_upgrade_fd(int fd);             // a pending fd became a gpusock socket
void epoll_forget_epfd(int epfd);          // close of an epoll fd
void epoll_dup_epfd(int oldfd, int newfd); // dup of an epoll fd
void epoll_after_fork_child();             // gpusock fds became kernel fds
bool epoll_is_emulated(int epfd);

// Fork/exec support.
void relay_after_fork_child();
void before_exec();

}  // namespace gpusock::preload
