// libgpusock.so, loaded on first use (library.h).
#include "preload/library.h"

#include <dlfcn.h>
#include <stdio.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>
#include <vector>

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

// dlopen by name, then from the shim's own directory (an installed shim's
// $ORIGIN), then from the build tree: a dlopen that a sanitizer's runtime
// intercepts searches that runtime's run path, not the shim's.
void *open_library() {
  void *handle = dlopen(GS_LIBRARY_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (handle) return handle;
  std::string first_error = dlerror();
  Dl_info self{};
  std::vector<std::string> dirs;
  if (dladdr(reinterpret_cast<void *>(&open_library), &self) && self.dli_fname) {
    const std::string path = self.dli_fname;
    const size_t slash = path.rfind('/');
    if (slash != std::string::npos) dirs.push_back(path.substr(0, slash));
  }
  dirs.push_back(GS_LIBRARY_BUILD_DIR);
  for (const std::string &dir : dirs)
    if ((handle = dlopen((dir + "/" + GS_LIBRARY_SONAME).c_str(), RTLD_NOW | RTLD_LOCAL))) return handle;
  snprintf(g_error, sizeof g_error, "cannot load %s: %s", GS_LIBRARY_SONAME, first_error.c_str());
  return nullptr;
}

void load() {
  void *handle = open_library();
  if (!handle) return;
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
  R(wait_end_polled);
  R(ready_set_create);
  R(ready_set_destroy);
  R(ready_set_ctl);
  R(ready_set_poll);
  R(ready_set_wait_begin);
  R(ready_set_wait_end_polled);
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
