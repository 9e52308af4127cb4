// Signal handler trampolines: the per-thread delivery count the emulated waits
// check, and the program's own handlers behind them (signals.h).
#include "preload/signals.h"

#include "preload/config.h"

#include <dlfcn.h>
#include <string.h>

#include <atomic>
#include <cstdint>

namespace gpusock::preload {

thread_local unsigned t_signals __attribute__((tls_model("initial-exec"))) = 0;
thread_local int t_signal_restart __attribute__((tls_model("initial-exec"))) = 0;

namespace {

struct Handler {
  std::atomic<uintptr_t> fn{0};
  std::atomic<int> flags{0};
};
Handler g_handlers[_NSIG];

void trampoline(int sig, siginfo_t *info, void *uc) {
  const int saved = errno;
  ++t_signals;
  const int flags = g_handlers[sig].flags.load(std::memory_order_relaxed);
  const uintptr_t fn = g_handlers[sig].fn.load(std::memory_order_relaxed);
  t_signal_restart = (flags & SA_RESTART) ? 1 : 0;
  if (flags & SA_RESETHAND) g_handlers[sig].fn.store(0, std::memory_order_relaxed);
  errno = saved;
  if (!fn) return;
  if (flags & SA_SIGINFO) reinterpret_cast<void (*)(int, siginfo_t *, void *)>(fn)(sig, info, uc);
  else reinterpret_cast<void (*)(int)>(fn)(sig);
}

}  // namespace

bool restart_after_eintr(unsigned signals_before) {
  if (t_signals == signals_before) return true;
  return t_signal_restart != 0;
}

int install_handler(int sig, const struct sigaction *act, struct sigaction *old) {
  const Real &R = real();
  if (sig <= 0 || sig >= _NSIG || sig == SIGKILL || sig == SIGSTOP) return R.sigaction(sig, act, old);
  const uintptr_t prev_fn = g_handlers[sig].fn.load();
  const int prev_flags = g_handlers[sig].flags.load();
  struct sigaction prev {};
  int r;
  if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN) {
    struct sigaction k = *act;
    k.sa_sigaction = trampoline;
    k.sa_flags |= SA_SIGINFO;
    g_handlers[sig].flags.store(act->sa_flags);
    g_handlers[sig].fn.store((act->sa_flags & SA_SIGINFO) ? reinterpret_cast<uintptr_t>(act->sa_sigaction)
                                                          : reinterpret_cast<uintptr_t>(act->sa_handler));
    r = R.sigaction(sig, &k, &prev);
    if (r < 0) {
      g_handlers[sig].fn.store(prev_fn);
      g_handlers[sig].flags.store(prev_flags);
    }
  } else {
    r = R.sigaction(sig, act, &prev);
    if (r == 0 && act) g_handlers[sig].fn.store(0);
  }
  if (r == 0 && old) {
    *old = prev;
    if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction == trampoline) {  // show the program its own handler
      old->sa_flags = prev_flags;
      if (prev_flags & SA_SIGINFO) old->sa_sigaction = reinterpret_cast<void (*)(int, siginfo_t *, void *)>(prev_fn);
      else old->sa_handler = reinterpret_cast<void (*)(int)>(prev_fn);
    }
  }
  return r;
}

// libfabric on Debian pulls in libinfinipath (through its psm provider, which
// gpusock never uses). Its constructor installs a backtrace handler for SIGINT,
// SIGILL, SIGABRT, SIGBUS, SIGSEGV and SIGTERM, which is not async-signal-safe
// (it can deadlock in malloc, leaving the process alive after SIGTERM) and
// changes what the signals do; its destructor puts the default actions back,
// at exit, in every process that loaded it: a call the program never made, of
// which a sandboxed child whose seccomp filter forbids rt_sigaction dies. The
// shim answers that library's calls without making them.
namespace {

bool in_foreign_library(const void *address) {
  Dl_info info;
  if (!address || !dladdr(address, &info) || !info.dli_fname) return false;
  return strstr(info.dli_fname, "libinfinipath") || strstr(info.dli_fname, "libpsm");
}

}  // namespace

bool foreign_signal_call(void *caller, const void *act) {
  return in_foreign_library(caller) || in_foreign_library(act);
}

int answer_foreign_signal_call(int sig, struct sigaction *old) {
  if (!old) return 0;
  return install_handler(sig, nullptr, old);
}

}  // namespace gpusock::preload
