// The libc entry points the shim forwards to, resolved once, and the guard.
#include "preload/libc.h"

#include <dlfcn.h>

namespace gpusock::preload {

thread_local int t_inside __attribute__((tls_model("initial-exec"))) = 0;

namespace {

template <class T>
void resolve(T *fn, const char *name) {
  *fn = reinterpret_cast<T>(dlsym(RTLD_NEXT, name));
}

Real load_real() {
  Real r{};
#define R(name) resolve(&r.name, #name)
  R(socket);
  R(socketpair);
  R(bind);
  R(listen);
  R(accept);
  R(accept4);
  R(connect);
  R(read);
  R(write);
  R(readv);
  R(writev);
  R(recv);
  R(send);
  R(recvfrom);
  R(sendto);
  R(recvmsg);
  R(sendmsg);
  R(sendfile);
  R(poll);
  R(ppoll);
  R(select);
  R(pselect);
  R(epoll_create);
  R(epoll_create1);
  R(epoll_ctl);
  R(epoll_wait);
  R(epoll_pwait);
  R(epoll_pwait2);
  R(fcntl);
  R(ioctl);
  R(setsockopt);
  R(getsockopt);
  R(getsockname);
  R(getpeername);
  R(shutdown);
  R(close);
  R(close_range);
  R(dup);
  R(dup2);
  R(dup3);
  R(fork);
  R(execve);
  R(execveat);
  R(fexecve);
  R(execvpe);
  R(fstat);
  R(sigaction);
  R(eventfd);
  R(pipe);
  R(pipe2);
  R(fopen);
  R(pthread_spin_lock);
  R(syscall);
#undef R
  return r;
}

}  // namespace

const Real &real() {
  static const Real r = load_real();
  return r;
}

}  // namespace gpusock::preload
