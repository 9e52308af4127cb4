// libgpusock.so, loaded on first use (library.h).
#include "preload/library.h"

#include <dlfcn.h>
#include <stdio.h>

#include <atomic>
#include <cerrno>
#include <mutex>

namespace gpusock::preload {

namespace {

Library g_library{};
std::once_flag g_once;
std::atomic<bool> g_loaded{false};
char g_error[512];

template <class T>
bool resolve(void *handle, T *fn, const char *name) {
  *fn = reinterpret_cast<T>(dlsym(handle, name));
  if (!*fn) snprintf(g_error, sizeof g_error, "%s lacks %s", GS_LIBRARY_SONAME, name);
  return *fn != nullptr;
}

void load() {
  // Found through the shim's run path (the build tree's library directory,
  // $ORIGIN once installed), then the system's.
  void *handle = dlopen(GS_LIBRARY_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    snprintf(g_error, sizeof g_error, "cannot load %s: %s", GS_LIBRARY_SONAME, dlerror());
    return;
  }
  Library l{};
  bool ok = true;
#define R(name) ok = ok && resolve(handle, &l.name, "gs_" #name)
  R(socket);
  R(bind);
  R(listen);
  R(accept4);
  R(connect);
  R(shutdown);
  R(close);
  R(recv);
  R(recvmsg);
  R(send);
  R(sendmsg);
  R(poll);
  R(wait_begin);
  R(wait_end);
  R(ready_set_create);
  R(ready_set_destroy);
  R(ready_set_ctl);
  R(ready_set_poll);
  R(ready_set_wait_begin);
  R(ready_set_wait_end);
  R(spin_budget_us);
  R(spin_record);
  R(spin_yield);
  R(spin_lock);
  R(getpeername);
  R(getsockname);
  R(setsockopt);
  R(getsockopt);
  R(fcntl);
  R(dup);
  R(dup3);
  R(last_error);
  R(fork_prepare);
  R(fork_parent);
  R(fork_child);
#undef R
  if (!ok) return;
  g_library = l;
  g_loaded.store(true, std::memory_order_release);
}

}  // namespace

int load_library() {
  if (!library_loaded()) std::call_once(g_once, load);
  return library_loaded() ? 0 : -ENOENT;
}

const char *load_error() { return g_error; }

bool library_loaded() { return g_loaded.load(std::memory_order_acquire); }

const Library &gs() { return g_library; }

}  // namespace gpusock::preload
