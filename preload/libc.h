// libgpusock_preload.so, bottom layer: the libc functions the shim defines
// again and forwards to, the guard that sends the library's own calls straight
// to libc, and the status conversion. See docs/preload.md for the design and
// preload/README.md for the layers (a file includes only the layers below it).
#pragma once

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>

#include <cerrno>
#include <cstdio>

// The shim's definition of a libc name: the only symbols the library exports.
#define GS_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpusock::preload {

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
  FILE *(*fopen)(const char *, const char *);
  int (*pthread_spin_lock)(pthread_spinlock_t *);
  long (*syscall)(long, ...);
};
const Real &real();

// Set while the shim runs library code on this thread: gpusock and libfabric
// call close/poll/fcntl/dup3/socket themselves, and those calls must reach libc.
extern thread_local int t_inside __attribute__((tls_model("initial-exec")));
struct Inside {
  Inside() { ++t_inside; }
  ~Inside() { --t_inside; }
  Inside(const Inside &) = delete;
  Inside &operator=(const Inside &) = delete;
};

// Converts a gs_* status (>= 0, or a negated errno) to the libc convention
// (-1 and errno).
template <class T>
inline T libc_result(T status) {
  if (status < 0) {
    errno = static_cast<int>(-status);
    return -1;
  }
  return status;
}

}  // namespace gpusock::preload
