// Listeners shared by the processes of a forked server: pre-fork workers,
// daemons, a master that accepts while its children work.
//
// A gpusock listener (its transport endpoint) belongs to one process, and the
// library abandons the parent's sockets in a forked child. So a listener is
// made again in each process that uses it:
//
// - In a child, an inherited listener is *dormant*: its fd numbers hold a
//   placeholder kernel socket (kDormant) and the ListenSpec says how to make
//   the listener (family, address and port, backlog, options set before
//   listen). The first accept, poll/select with it, or epoll_ctl/epoll_wait
//   with it *activates* it: a new gpusock listener on the same address replaces
//   the placeholder on the same numbers. A child that never uses it (a CGI
//   child, a background save) never listens.
// - At fork the parent sets its own listener aside (dormant as well) when it
//   has not used it since listen() or its last fork and nothing waits on it:
//   the master of nginx or apache2 never accepts, and must not take
//   connections its workers should get. A parent that uses it keeps it.
// - Whether several processes can listen on the address at once is the
//   transport's: fabric:tcp can (all processes accept from one kernel
//   listening socket, the *anchor*: the shim hands it to libfabric when libfabric
//   binds the listener's socket, so the kernel's queue is shared as with
//   kernel TCP); where the transport refuses a second listener (EADDRINUSE:
//   verbs' rdma_cm), the process that holds the port serves every connection
//   and the others try again every kRetry until it is free, saying why once.
//
// Every connection is accepted and served by one process: no byte is relayed.
#pragma once

#include "preload/fd_table.h"

#include <poll.h>

#include <memory>
#include <vector>

namespace gpusock::preload {

// listen() on gpusock fd is about to be made: its spec, to arm (ListenArm) so
// the transport's socket gets IPV6_V6ONLY as the application set it.
std::shared_ptr<ListenSpec> spec_for_listen(int fd);
// GS_ACCEPT_ON_DEMAND on a gpusock listener (on from listen()): a process
// takes a connection only while it accepts or waits on the listener, so none
// is taken by a master that forks and sets its listener aside, or by a worker
// busy with another connection; the transport ignores it where requests
// cannot wait (verbs).
void share_accepts(int gs_fd);
// listen() succeeded on gpusock fd: remember how to listen again elsewhere.
void note_listen(int fd, int backlog);
// setsockopt() on a gpusock socket before listen, or on a dormant listener:
// recorded for the listeners made from its spec.
void note_listen_option(const std::shared_ptr<ListenSpec> &spec, int level, int name, const void *val, socklen_t len);
// A gpusock listener was used by the application (accept, a wait with it).
bool listener_used_since_mark(int fd, const ListenSpec &spec);

// ---------------------------------------------------------------- dormant listeners

// Makes the dormant listener fd a gpusock listener in this process (every fd
// of it). 1: fd is a gpusock listener now; 0: not now (the port is held by
// another process, or the transport failed: said once in the log; try again
// after kRetry); < 0: a negated errno for the caller.
int activate(int fd);
// Tries every dormant fd in fds[0..n); returns how many are still dormant.
int activate_dormant(const pollfd *fds, size_t n);
// accept() on a dormant listener: activates it, waiting (blocking socket) or
// answering EAGAIN (non-blocking) while it cannot be. 0 when fd is a gpusock
// listener now, -1 with errno otherwise.
int accept_ready_dormant(int fd);
// How often a dormant listener whose port is held elsewhere tries again.
constexpr long kRetryMs = 200;

// ---------------------------------------------------------------- fork

// Before fork, in the parent, for a gpusock listener with these fds: makes
// sure the anchor exists (fabric:tcp), and says whether the parent sets the
// listener aside (unused since its last mark, no waiter, not in an epoll set,
// no connection waiting in its queue). Marks it used-never.
bool prepare_listener_fork(const std::vector<int> &fds, const std::shared_ptr<SockInfo> &info);
// In the child: each fd of the listener becomes dormant on the placeholder
// `placeholder` (dup3()ed onto it).
void child_listener_dormant(const std::vector<std::pair<int, bool>> &fds, int placeholder,
                            std::shared_ptr<ListenSpec> spec);
// In the child: the specs' locks may have been held by other threads at fork.
void dormant_after_fork_child();
// In the parent, just before the fork: sets the listener aside (fds become
// dormant placeholders), so that no connection reaches it while it closes.
void set_listener_aside(const std::vector<std::pair<int, bool>> &fds, std::shared_ptr<ListenSpec> spec,
                        bool nonblocking);

// ---------------------------------------------------------------- the transport's bind

// bind() from the transport (libfabric's listening socket): when this thread
// is making a shared listener, the fd becomes the anchor (the kernel socket
// the processes share) and IPV6_V6ONLY is applied as the application set it.
// 1: handled (bind's result is 0), 0: not ours (bind as usual).
int transport_bind(int fd, const sockaddr *addr, socklen_t len);
// The spec of the listener this thread is making (armed around gs_listen).
struct ListenArm {
  explicit ListenArm(ListenSpec *spec);
  ~ListenArm();
  ListenArm(const ListenArm &) = delete;
  ListenArm &operator=(const ListenArm &) = delete;
};

}  // namespace gpusock::preload
