// Top layer: the process-wide calls. The library's constructor; sigaction,
// signal, bsd_signal and sysv_signal (handlers are wrapped, signals.h); fork
// and syscall's fork-like clones (relays, fork.h); the exec family (gpusock sockets are closed in order
// first, fork.h); fopen of /proc/kallsyms by libfabric; pthread_spin_lock
// (libgpusock's, which libc would otherwise precede for libfabric's calls).
#include "preload/config.h"
#include "preload/fork.h"
#include "preload/library.h"
#include "preload/signals.h"

#include <linux/sched.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

extern char **environ;

using namespace gpusock::preload;

__attribute__((constructor)) static void gpusock_preload_init() {
  real();
  note_own_process();
  init_config();
}

// ------------------------------------------------------------------ spin locks

// Until the library is loaded, glibc's (libfabric is not loaded either).
#if !defined(__SANITIZE_THREAD__)  // under TSan its interceptor and glibc's lock
GS_EXPORT int pthread_spin_lock(pthread_spinlock_t *lock) {
  return library_loaded() ? gs().spin_lock(lock) : real().pthread_spin_lock(lock);
}
#endif

// ------------------------------------------------------------------ signals

GS_EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
  if (foreign_signal_call(__builtin_return_address(0), act)) return answer_foreign_signal_call(sig, old);
  return install_handler(sig, act, old);
}

namespace {

// glibc's signal() has BSD semantics: SA_RESTART, the signal blocked in its handler.
sighandler_t bsd_semantics_signal(int sig, sighandler_t handler) {
  struct sigaction a {
  }, o{};
  a.sa_handler = handler;
  sigemptyset(&a.sa_mask);
  if (sig > 0 && sig < _NSIG) sigaddset(&a.sa_mask, sig);
  a.sa_flags = SA_RESTART;
  if (sigaction(sig, &a, &o) < 0) return SIG_ERR;
  return o.sa_handler;
}

// What a signal() from a foreign library (signals.h) gets: the handler in force.
sighandler_t answer_foreign_signal(int sig) {
  struct sigaction o {};
  if (answer_foreign_signal_call(sig, &o) < 0) return SIG_ERR;
  return o.sa_handler;
}

}  // namespace

GS_EXPORT sighandler_t signal(int sig, sighandler_t handler) {
  if (foreign_signal_call(__builtin_return_address(0), nullptr)) return answer_foreign_signal(sig);
  return bsd_semantics_signal(sig, handler);
}

GS_EXPORT sighandler_t bsd_signal(int sig, sighandler_t handler) {
  if (foreign_signal_call(__builtin_return_address(0), nullptr)) return answer_foreign_signal(sig);
  return bsd_semantics_signal(sig, handler);
}

GS_EXPORT sighandler_t sysv_signal(int sig, sighandler_t handler) {
  if (foreign_signal_call(__builtin_return_address(0), nullptr)) return answer_foreign_signal(sig);
  struct sigaction a {
  }, o{};
  a.sa_handler = handler;
  sigemptyset(&a.sa_mask);
  a.sa_flags = SA_RESETHAND | SA_NODEFER;
  if (sigaction(sig, &a, &o) < 0) return SIG_ERR;
  return o.sa_handler;
}

// ------------------------------------------------------------------ fork

GS_EXPORT pid_t fork(void) {
  if (t_inside) return real().fork();
  return fork_with_relays([] { return real().fork(); });
}

// ------------------------------------------------------------------ raw clone

namespace {

// A clone system call that makes a process as fork() does: its own memory,
// going on on the caller's stack (as syscall() can only be used to).
bool fork_like_clone(long number, const long *args) {
  constexpr uint64_t kShares = CLONE_VM | CLONE_VFORK | CLONE_THREAD | CLONE_SIGHAND;
  if (number == SYS_clone) return (static_cast<uint64_t>(args[0]) & kShares) == 0 && args[1] == 0;
  if (number == SYS_clone3) {
    const auto *ca = reinterpret_cast<const clone_args *>(args[0]);
    return ca && static_cast<size_t>(args[1]) >= CLONE_ARGS_SIZE_VER0 && (ca->flags & kShares) == 0 && ca->stack == 0;
  }
  return false;
}

// The clone, with the library's fork handlers around it (a raw clone runs
// none, and the library must know a child from its parent).
pid_t clone_with_fork_handlers(long number, const long *args) {
  const bool loaded = library_loaded();
  if (loaded) gs().fork_prepare();
  const long pid = real().syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]);
  const int saved = errno;
  if (loaded) (pid == 0 ? gs().fork_child : gs().fork_parent)();
  errno = saved;
  return static_cast<pid_t>(pid);
}

}  // namespace

// syscall(SYS_clone or SYS_clone3, ...) making a process as fork() does is a
// fork for the shim: the child gets relays and dormant listeners, and tears
// down nothing of its parent's. It reads six arguments whatever the call
// takes, as glibc's syscall() does; those a caller did not pass are whatever
// its stack holds there, so AddressSanitizer must not check these reads.
GS_EXPORT __attribute__((no_sanitize("address"))) long syscall(long number, ...) noexcept {
  va_list ap;
  va_start(ap, number);
  long args[6];
  for (long &a : args) a = va_arg(ap, long);  // as many as any system call takes, as glibc's syscall() reads
  va_end(ap);
  if (!t_inside && fork_like_clone(number, args))
    return fork_with_relays([&] { return clone_with_fork_handlers(number, args); });
  return real().syscall(number, args[0], args[1], args[2], args[3], args[4], args[5]);
}

// ------------------------------------------------------------------ exec family

GS_EXPORT int execve(const char *path, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().execve(path, argv, envp);
}

GS_EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }

GS_EXPORT int execvpe(const char *file, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().execvpe(file, argv, envp);
}

GS_EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

GS_EXPORT int fexecve(int fd, char *const argv[], char *const envp[]) {
  if (!t_inside) before_exec();
  return real().fexecve(fd, argv, envp);
}

GS_EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
  if (!real().execveat) {
    errno = ENOSYS;
    return -1;
  }
  if (!t_inside) before_exec();
  return real().execveat(dirfd, path, argv, envp, flags);
}

namespace {

// execl's argument list up to its null pointer; ap stays usable after it
// (execle's envp follows).
std::vector<char *> collect_args(const char *arg0, va_list *ap) {
  std::vector<char *> v;
  v.push_back(const_cast<char *>(arg0));
  while (v.back()) v.push_back(va_arg(*ap, char *));
  return v;
}

}  // namespace

GS_EXPORT int execl(const char *path, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto v = collect_args(arg, &ap);
  va_end(ap);
  return execve(path, v.data(), environ);
}

GS_EXPORT int execlp(const char *file, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto v = collect_args(arg, &ap);
  va_end(ap);
  return execvpe(file, v.data(), environ);
}

GS_EXPORT int execle(const char *path, const char *arg, ...) {
  va_list ap;
  va_start(ap, arg);
  auto v = collect_args(arg, &ap);
  char *const *envp = va_arg(ap, char *const *);
  va_end(ap);
  return execve(path, v.data(), envp);
}

// libfabric 1.17 initializes its verbs provider whatever provider gpusock asks
// for, and that reads /proc/kallsyms twice (looking for peer-memory and
// dma-buf support): some 120,000 lines the kernel formats, most of the time a
// short-lived client under the shim spends starting (0.1 to 0.3 s here,
// counted in curl's download rate, since the transport opens at the first
// socket). gpusock never uses libfabric's verbs provider, so while the library
// runs the file is not there for it (the provider then assumes neither).
GS_EXPORT FILE *fopen(const char *path, const char *mode) {
  if (t_inside && path != nullptr && std::strcmp(path, "/proc/kallsyms") == 0) {
    errno = ENOENT;
    return nullptr;
  }
  return real().fopen(path, mode);
}
