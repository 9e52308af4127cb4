// libgpusock.so as the shim calls it. The library links libfabric, and loading
// libfabric costs every process (its dependencies' constructors: libinfinipath
// calibrates its clock by sleeping), so the shim does not link it: it is
// loaded (dlopen) when a process is about to make its first gpusock socket
// (probe_transport), and its entry points are resolved then, once, into one
// table. A process that never does so never maps libfabric. Bottom layer.
#pragma once

#include <gpusock/socket.h>

namespace gpusock::preload {

// The library's entry points the shim calls (include/gpusock/socket.h).
struct Library {
  decltype(&::gs_socket) socket;
  decltype(&::gs_bind) bind;
  decltype(&::gs_listen) listen;
  decltype(&::gs_accept4) accept4;
  decltype(&::gs_connect) connect;
  decltype(&::gs_shutdown) shutdown;
  decltype(&::gs_close) close;
  decltype(&::gs_recv) recv;
  decltype(&::gs_recvmsg) recvmsg;
  decltype(&::gs_send) send;
  decltype(&::gs_sendmsg) sendmsg;
  decltype(&::gs_poll) poll;
  decltype(&::gs_wait_begin) wait_begin;
  decltype(&::gs_wait_end_polled) wait_end_polled;
  decltype(&::gs_ready_set_create) ready_set_create;
  decltype(&::gs_ready_set_destroy) ready_set_destroy;
  decltype(&::gs_ready_set_ctl) ready_set_ctl;
  decltype(&::gs_ready_set_poll) ready_set_poll;
  decltype(&::gs_ready_set_wait_begin) ready_set_wait_begin;
  decltype(&::gs_ready_set_wait_end_polled) ready_set_wait_end_polled;
  decltype(&::gs_spin_budget_us) spin_budget_us;
  decltype(&::gs_spin_record) spin_record;
  decltype(&::gs_spin_yield) spin_yield;
  decltype(&::gs_spin_lock) spin_lock;
  decltype(&::gs_getpeername) getpeername;
  decltype(&::gs_getsockname) getsockname;
  decltype(&::gs_setsockopt) setsockopt;
  decltype(&::gs_getsockopt) getsockopt;
  decltype(&::gs_fcntl) fcntl;
  decltype(&::gs_dup) dup;
  decltype(&::gs_dup3) dup3;
  decltype(&::gs_last_error) last_error;
  decltype(&::gs_fork_prepare) fork_prepare;
  decltype(&::gs_fork_parent) fork_parent;
  decltype(&::gs_fork_child) fork_child;
};

// Loads the library (once per process, whichever thread comes first; the
// others wait for it). 0 when it is loaded, -ENOENT when it could not be:
// load_error() says why.
int load_library();
const char *load_error();
// Whether the library is loaded (no waiting, no loading).
bool library_loaded();

// The entry points. Valid once load_library() returned 0: every gpusock
// socket, dormant listener and wait on them comes after that.
const Library &gs();

}  // namespace gpusock::preload
