// Fork relays: a connected gpusock socket carried on for a forked child. The
// child holds one end of an AF_UNIX socketpair on the socket's fd numbers; a
// relay thread in the parent pumps the other end to and from the gpusock
// connection. The child's data goes out at once. Kernel sockets give incoming
// data to whichever process reads first; the relay passes it to the child once
// the parent has closed all its fds of the socket, once the child has written
// to it, or while the parent has neither read nor waited for readability on it
// for 50 ms (a parent in waitpid). A parent that keeps using the socket keeps
// its data. fork.h decides which sockets get a relay.
#pragma once

#include "preload/fd_table.h"

#include <memory>
#include <mutex>
#include <vector>

namespace gpusock::preload {

std::mutex &relay_mutex();  // the relay list (held across fork)

// The functions below need relay_mutex() held.
// The parent's relay fds (the child closes its copies).
std::vector<int> relay_fds_locked();
// Relays the socket `info` for a child: r is the parent's end of the
// socketpair (non-blocking, close-on-exec), g the shim's own gpusock fd of the
// socket (kInternal), parent_fds the parent's fds of the socket at fork time.
void add_relay_locked(int r, int g, std::shared_ptr<SockInfo> info, std::vector<int> parent_fds);
// Starts the relay thread (once) and wakes it, if there are relays.
void run_relays_locked();

// In a forked child: the relays and their thread are the parent's.
void relay_after_fork_child();

}  // namespace gpusock::preload
