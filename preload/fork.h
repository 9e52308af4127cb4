// fork and exec: what each gpusock fd becomes in a child process and across an
// exec.
//
// fork. A gpusock connection lives in this process (transport endpoints,
// registered rings, a progress thread), which the child cannot share. At fork
// each connected gpusock socket gets a relay (relay.h): the child sees a
// working kernel stream socket on the same fd numbers, also after exec.
// Listening sockets are not relayed: in the child they are dormant, and the
// child listens on the same address itself when it uses them; an unused
// listener is set aside in the parent (listeners.h). The library abandons its inherited state
// in the child (Engine::fork_child), so a child that does not exec can still
// make new gpusock sockets.
//
// exec. gpusock sockets cannot survive exec (their state is the process
// image): before the exec each one is closed in order (flushed, DISCONNECT
// sent; at most 5 s), so the peer sees an orderly end rather than a hang.
#pragma once

#include <sys/types.h>

namespace gpusock::preload {

// fork() from the application (outside the guard).
pid_t fork_with_relays();

// Closes every gpusock socket in order before an exec.
void before_exec();

}  // namespace gpusock::preload
