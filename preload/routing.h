// Routing between the kernel and gpusock: which sockets the shim takes, the
// decision at bind/listen/connect, the upgrade of a pending kernel socket to a
// gpusock socket on the same fd number, and how an fd leaves the shim's tables
// when it is closed or its number is replaced.
//
// A TCP socket starts life as a kernel socket marked "pending". At bind (with a
// port), listen or connect the port lists decide: a selected socket is
// "upgraded" by creating a gpusock socket and dup3()-ing its reserved fd over
// the kernel socket's number, which atomically replaces the kernel socket; an
// excluded one simply stays the kernel's, untouched.
#pragma once

#include "preload/config.h"
#include "preload/epoll_table.h"
#include "preload/fd_table.h"

#include <cstdint>
#include <string>
#include <vector>

namespace gpusock::preload {

// close() of this fd number from inside the library is skipped once (dup2 over
// a gpusock fd: the library forgets the socket, the number is replaced).
extern thread_local int t_skip_close __attribute__((tls_model("initial-exec")));

// ------------------------------------------------------------------ whose call, which socket

// Is this call (ret: the caller's return address) made by gpusock or libfabric
// themselves: inside the guard, or from their own code (a provider's thread)?
bool called_from_transport(void *ret);
bool transport_caller(void *ret);  // t_inside || called_from_transport(ret)

// A socket() the shim may take: AF_INET/AF_INET6 stream, TCP, and the rules.
bool intercept_candidate(int domain, int type, int protocol);

// Can this process create gpusock sockets? 0 yes, < 0 the error (probed once,
// loading the library first: library.h); probe_error() is the explanation.
int probe_transport();
const char *probe_error();
// The same for a socket the shim would take, saying once why not: 0 usable;
// 1 not, the socket stays the kernel's (the fallback); a negated errno: not,
// and the call fails (GPUSOCK_FALLBACK=refuse).
int transport_or_fallback();

int port_of(const sockaddr *addr, socklen_t len, uint16_t *port);  // -1: not IP
std::string addr_text(const sockaddr *addr, socklen_t len);        // for the log
const char *transport_name();                                      // for the log

// ------------------------------------------------------------------ the decision

// Decides a pending socket at bind, listen or connect by its port: an excluded
// port leaves it the kernel's for good, a selected one upgrades it (where
// ports are listed, the transport is first loaded here, not at socket()). `what`
// names the call in the log. Returns 1 when fd is now a gpusock socket, 0 when
// it stays the kernel's (also when the transport is unusable: the fallback),
// -1 with errno when the upgrade failed or the transport is refused (the
// kernel socket is then left as it was).
int decide_pending(int fd, const Pending &p, uint16_t port, const std::string &what);
// The socket stays the kernel's for good (its port is excluded).
void finalize_kernel(int fd);
// The address a port-0 bind got from the kernel before the decision, bound
// again on the gpusock socket so getsockname answers the same.
void bind_recorded(int fd, const Pending &p);
// SO_RCVTIMEO / SO_SNDTIMEO of a gpusock socket (the shim emulates them).
void note_timeout(int fd, int name, const void *val, socklen_t len);
void note_timeouts(int fd, const std::vector<Pending::Opt> &opts);  // those among recorded options
// A new gpusock socket (not yet on an application fd) with the recorded
// options applied (timeouts excepted: note_timeouts once it has its fd).
// Returns its fd or a negated errno.
int new_gs_socket(int domain, bool nonblocking, const std::vector<Pending::Opt> &opts);

// ------------------------------------------------------------------ leaving the tables

// Clears the shim's state for fd before its number is replaced or closed.
// Returns the kind fd had.
uint8_t drop_fd_state(int fd);
// newfd is about to receive another file (dup2/dup3 with a kernel source).
void release_gs_target(int newfd);
// close() from the application (outside the guard).
int close_fd(int fd);

}  // namespace gpusock::preload
