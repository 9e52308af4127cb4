// What a fork relay's child end says about itself. The child holds an AF_UNIX
// socket where the application had a TCP connection (relay.h); the kernel
// would answer getsockname/getpeername with the connection's addresses. The
// child's end is bound to an abstract AF_UNIX name that carries them, so the
// answer travels with the socket: through dup, exec and fd passing, in any
// process that runs the shim.
#pragma once

#include "preload/libc.h"

namespace gpusock::preload {

struct ConnectionNames {
  sockaddr_storage local{}, peer{};
  socklen_t local_len = 0, peer_len = 0;
};

// Binds the child's end c of a relay to a name carrying `names`; false if it
// could not (the child then sees a plain AF_UNIX socket).
bool name_relay_end(int c, const ConnectionNames &names);

// If fd is a relay's child end (the kernel's answer for it was AF_UNIX):
// the names of its connection.
bool relay_end_names(int fd, ConnectionNames *out);

bool is_relay_end(int fd);

// Copies an address out as getsockname does: truncated to *len, *len set to
// its full length.
void copy_address_out(const sockaddr_storage &from, socklen_t from_len, sockaddr *to, socklen_t *len);

}  // namespace gpusock::preload
