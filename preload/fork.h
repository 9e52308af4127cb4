// fork and exec: what each gpusock fd becomes in a child process and across an
// exec.
//
// fork. Also a raw clone system call that makes a process as fork() does
// (a server that isolates each child in new namespaces): the shim sees it in
// syscall(), and runs the library's fork handlers around it itself.
//
// A gpusock connection lives in this process (transport endpoints,
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

#include <functional>

namespace gpusock::preload {

// fork() from the application (outside the guard), or another call that makes
// a process as fork() does: make_child makes it and returns as fork() does
// (the child's pid, 0 in the child, -1 with errno).
pid_t fork_with_relays(const std::function<pid_t()> &make_child);

// The shim's tables belong to this process (at start-up, in a child it made).
void note_own_process();
// A process made by a clone the shim did not see (glibc's clone(), a system
// call made without syscall()) holds its parent's tables. The first close,
// accept or listen of a gpusock fd there makes it what a fork's child
// is, without relays (the parent made none): inherited listeners dormant,
// inherited connections unconnected sockets (they are the parent's).
// Returns kVforkChild, touching nothing, in a vfork() child: it runs on its
// parent's memory, the tables are the parent's, only its fd numbers its own.
enum class Tables { kOwn, kVforkChild };
Tables adopt_if_cloned();

// Closes every gpusock socket in order before an exec.
void before_exec();

}  // namespace gpusock::preload
