/* gpusock CPU stream sockets: the rsocket call set (rsocket.7) with gs_ names.
 *
 * Semantics follow rsocket and POSIX stream sockets. Status contract
 * (gpusock/status.h): every call returns >= 0 on success and the negated errno
 * on failure, and also sets errno. Non-blocking sockets return -EAGAIN for
 * back-pressure.
 *
 * The transport is chosen per process by GPUSOCK_TRANSPORT:
 *   verbs       rdma_cm + RC queue pairs (rsocket wire compatible)
 *   fabric:tcp  libfabric tcp provider (FI_EP_MSG)
 *   fabric:shm  libfabric shm provider (FI_EP_RDM, same host only)
 * Default: verbs if an RDMA device exists, else fabric:tcp. A socket whose
 * transport cannot be opened fails with -ENODEV/-ENOENT and gs_last_error()
 * names what is missing. */
#ifndef GPUSOCK_SOCKET_H
#define GPUSOCK_SOCKET_H

#include <gpusock/status.h>

#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* rsocket's option level and options (rsocket.h values, so programs written
 * for rsocket compile unchanged). */
#ifndef SOL_RDMA
#define SOL_RDMA 0x10000
enum { RDMA_SQSIZE, RDMA_RQSIZE, RDMA_INLINE, RDMA_IOMAPSIZE, RDMA_ROUTE };
#endif

/* gpusock's own option level. GS_ACCEPT_ON_DEMAND (int, on a listener): take
 * connection requests off the transport only while the application accepts or
 * waits on the listener (or while a connect of this process is under way: it
 * may be to this listener), not from the library's background thread, so that
 * requests a busy process would not serve stay where other processes listening
 * on the same port (a forked server over fabric:tcp) can take them; and one
 * at a time (a request taken is this process's alone, and lost if it exits
 * before accepting it). Off by default: handshakes complete in the background,
 * as a kernel's TCP does. Ignored over verbs, where rdma_cm's request times out
 * unanswered. */
#define SOL_GPUSOCK 0x67730000
enum { GS_ACCEPT_ON_DEMAND = 1 };

int gs_socket(int domain, int type, int protocol);
int gs_bind(int socket, const struct sockaddr *addr, socklen_t addrlen);
int gs_listen(int socket, int backlog);
int gs_accept(int socket, struct sockaddr *addr, socklen_t *addrlen);
int gs_accept4(int socket, struct sockaddr *addr, socklen_t *addrlen, int flags);
int gs_connect(int socket, const struct sockaddr *addr, socklen_t addrlen);
int gs_shutdown(int socket, int how);
int gs_close(int socket);

ssize_t gs_recv(int socket, void *buf, size_t len, int flags);
ssize_t gs_recvfrom(int socket, void *buf, size_t len, int flags, struct sockaddr *src_addr, socklen_t *addrlen);
ssize_t gs_recvmsg(int socket, struct msghdr *msg, int flags);
ssize_t gs_send(int socket, const void *buf, size_t len, int flags);
ssize_t gs_sendto(int socket, const void *buf, size_t len, int flags, const struct sockaddr *dest_addr,
                  socklen_t addrlen);
ssize_t gs_sendmsg(int socket, const struct msghdr *msg, int flags);
ssize_t gs_read(int socket, void *buf, size_t count);
ssize_t gs_readv(int socket, const struct iovec *iov, int iovcnt);
ssize_t gs_write(int socket, const void *buf, size_t count);
ssize_t gs_writev(int socket, const struct iovec *iov, int iovcnt);

/* fds may mix gpusock sockets and ordinary kernel fds. Waits on events: a
 * short adaptive spin (GPUSOCK_BUSY_POLL_US caps it), then a sleep in the
 * kernel on the sockets' transport wait fds: an idle wait costs no CPU. */
int gs_poll(struct pollfd *fds, nfds_t nfds, int timeout);

/* For code that sleeps itself (an event loop, the LD_PRELOAD shim's
 * poll/select/epoll): prepares this thread to sleep until one of the gpusock
 * sockets among fds[0..nfds) has one of its requested events. Writes into
 * `wait` (up to `max`) the kernel fds to poll for POLLIN -- the sockets'
 * transport wait fds and this thread's waker, which another thread's progress
 * on those sockets writes -- and returns how many. Returns -EAGAIN when a
 * socket is ready already (look again instead of sleeping), -ENOSPC when max
 * is too small, 0 when a transport has no wait fd (sleep a short while
 * instead, e.g. 10 us doubling to 1 ms). Non-gpusock fds are ignored: add
 * them to the sleep yourself. Whatever it returned but -EAGAIN and -ENOSPC,
 * call gs_wait_end with the same fds after the sleep. */
int gs_wait_begin(const struct pollfd *fds, nfds_t nfds, struct pollfd *wait, nfds_t max);
void gs_wait_end(const struct pollfd *fds, nfds_t nfds);
/* gs_wait_end after a sleep in poll(2) over gs_wait_begin's fds: `slept` is
 * that array as poll left it (revents filled in), and only the wait fds it
 * found readable are read -- a sleep that a socket's own fd ended makes no
 * read of this thread's waker. */
void gs_wait_end_polled(const struct pollfd *fds, nfds_t nfds, const struct pollfd *slept, nfds_t nslept);
/* The spin-then-sleep policy of gpusock's own waits, for code that waits
 * itself: how long this thread should spin before sleeping (microseconds; it
 * may take one of the process's spin slots, at most GPUSOCK_MAX_SPINNERS,
 * by default half the cores, given back by gs_wait_begin or gs_spin_record),
 * and how long a finished wait took (call it on every way out of the wait: a
 * short one lets the next spin the whole ceiling, a long one halves it;
 * GPUSOCK_BUSY_POLL_US is the ceiling). */
long gs_spin_budget_us(void);
void gs_spin_record(long waited_us);
/* One yield of such a spin: 0 when this thread had its core to itself, 1
 * when another thread ran on it meanwhile -- more runnable threads than
 * cores: stop spinning and sleep now (the next spins are shorter). */
int gs_spin_yield(void);
/* pthread_spin_lock as gpusock's libraries define it for the process: spins
 * for a few microseconds, then yields its core, then naps, so that a holder
 * that was preempted runs (libfabric's shm guards its shared regions with
 * spin locks). libgpusock.so exports pthread_spin_lock itself; a preloaded
 * shim, which libc precedes in the lookup order, forwards its own here. */
int gs_spin_lock(pthread_spinlock_t *lock);

/* Readiness sets, for event loops that keep hundreds of sockets (the
 * LD_PRELOAD shim's epoll): the set remembers which of its sockets may have
 * news -- those the transport hinted (fabric:shm), those ready at the last
 * look, those whose transport gives no hints -- so that a look costs what
 * those cost, not what all members cost. Every member is looked at at least
 * every 10 ms. One set may be used by several threads. */
typedef struct gs_ready_set gs_ready_set_t;
gs_ready_set_t *gs_ready_set_create(void); /* NULL with errno ENOMEM */
void gs_ready_set_destroy(gs_ready_set_t *set);
/* op: EPOLL_CTL_ADD, EPOLL_CTL_MOD or EPOLL_CTL_DEL of gpusock socket fd,
 * for poll(2) events (POLLERR and POLLHUP are always reported). 0, or
 * -EEXIST, -ENOENT, -ENOTSOCK, -EINVAL. */
int gs_ready_set_ctl(gs_ready_set_t *set, int op, int fd, short events);
/* One look, never waits: writes up to max ready members (fd, events,
 * revents) into out and returns how many, or a negated errno. *all (may be
 * NULL) says whether this look went over every member. Sleep with
 * gs_wait_begin over the members when it finds nothing. */
int gs_ready_set_poll(gs_ready_set_t *set, struct pollfd *out, int max, int *all);
/* gs_wait_begin and gs_wait_end over every member of the set: members its
 * last look found quiet (and no hint since) are armed without a progress
 * pass first, so a thread with hundreds of idle members sleeps cheaply. */
int gs_ready_set_wait_begin(gs_ready_set_t *set, struct pollfd *wait, nfds_t max);
void gs_ready_set_wait_end(gs_ready_set_t *set);
void gs_ready_set_wait_end_polled(gs_ready_set_t *set, const struct pollfd *slept, nfds_t nslept);

int gs_getpeername(int socket, struct sockaddr *addr, socklen_t *addrlen);
int gs_getsockname(int socket, struct sockaddr *addr, socklen_t *addrlen);
int gs_setsockopt(int socket, int level, int optname, const void *optval, socklen_t optlen);
int gs_getsockopt(int socket, int level, int optname, void *optval, socklen_t *optlen);
/* F_GETFL/F_SETFL (O_NONBLOCK), F_GETFD/F_SETFD (FD_CLOEXEC). */
int gs_fcntl(int socket, int cmd, ... /* arg */);

/* dup(2)/dup2(2)/dup3(2) for sockets: the new fd refers to the same socket,
 * which closes when its last fd does. flags: O_CLOEXEC. */
int gs_dup(int socket);
int gs_dup2(int socket, int newfd);
int gs_dup3(int socket, int newfd, int flags);

/* fork() runs these itself (pthread_atfork): a child abandons the parent's
 * sockets and transport without touching them and opens its own. A process
 * that makes a child with a raw clone system call, which runs no fork
 * handlers, calls gs_fork_prepare() just before it, then gs_fork_parent() in
 * the parent and gs_fork_child() in the child. */
void gs_fork_prepare(void);
void gs_fork_parent(void);
void gs_fork_child(void);

/* Whether fd is a gpusock socket (1) or not (0). */
int gs_is_socket(int fd);
/* The last error's explanation for this thread, e.g. which provider is missing. */
const char *gs_last_error(void);

#ifdef __cplusplus
}
#endif

#endif
