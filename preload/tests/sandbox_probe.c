/* sandbox_probe: servers that isolate each client the way sandboxing servers
 * do, and what the shim may cost a process that never opens a gpusock
 * socket, as plain socket programs (no gpusock headers) run under the shim.
 *
 *   clone-server PORT CONNS   listen on 127.0.0.1:PORT; for each of CONNS
 *       connections: accept, make the child with a raw clone system call
 *       (CLONE_NEWIPC|SIGCHLD: no fork handlers run; plain SIGCHLD where new
 *       namespaces are not permitted, said so); the child closes the
 *       inherited listener, echoes the connection to EOF and exits; the
 *       parent closes its copy and waits for the child
 *   hidden-clone-server PORT CONNS   the same, but the child is made by
 *       glibc's clone() (which the shim does not see) and only closes the
 *       inherited listener and connection and exits; the parent then echoes
 *       the connection itself
 *   vfork-server PORT CONNS   the same with vfork(): the child, on its
 *       parent's memory, closes the listener and the connection and _exit()s
 *   seccomp-server PORT       listen, accept one connection, fork; the child
 *       installs a seccomp filter that kills the process on rt_sigaction,
 *       echoes the connection to EOF and exits normally: it must exit 0
 *   client PORT CONNS BYTES   CONNS connections one after another: BYTES
 *       sent in chunks, each read back and compared
 *   maps WHAT [PORT]          WHAT = none, kernel (a UDP and a unix socket),
 *       tcp (a TCP socket, which the shim takes) or listen (a TCP socket
 *       listening on 127.0.0.1:PORT): prints whether libfabric is mapped in
 *       this process; exit status 0 when it is not
 *
 * Every check prints "ok: ..." or "FAIL: ..."; the exit status of the servers
 * and the client is the number of failed checks. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "probe_check.h"
#include "probe_io.h"

enum { kChunk = 4096 };

static int listen_on(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 16) == 0, "listening on port %d", port);
  printf("listening\n");
  fflush(stdout);
  return fd;
}

/* Echoes fd to EOF; 0 when every read was written back. */
static int echo(int fd) {
  char buf[kChunk];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return 0;
    if (n < 0 || write_all(fd, buf, (size_t)n) < 0) return -1;
  }
}

/* The parent's view of a child that served one connection. */
static void wait_child(pid_t pid, const char *what) {
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "%s child %d exited 0 (status 0x%x%s%d)", what, (int)pid, status,
        WIFSIGNALED(status) ? ", killed by signal " : ", exit ",
        WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static int clone_server(int port, int conns) {
  int lfd = listen_on(port);
  int flags = CLONE_NEWIPC | SIGCHLD;
  for (int i = 0; i < conns; ++i) {
    int c = accept(lfd, NULL, NULL);
    CHECK(c >= 0, "accepted connection %d", i);
    if (c < 0) break;
    long pid = syscall(SYS_clone, flags, 0, 0, 0, 0);
    if (pid < 0 && errno == EPERM && flags != SIGCHLD) {
      printf("note: CLONE_NEWIPC not permitted here: plain SIGCHLD clones instead\n");
      flags = SIGCHLD;
      pid = syscall(SYS_clone, flags, 0, 0, 0, 0);
    }
    if (pid == 0) {
      close(lfd);
      int r = echo(c);
      close(c);
      exit(r == 0 ? 0 : 1);
    }
    CHECK(pid > 0, "raw clone for connection %d", i);
    close(c);
    if (pid > 0) wait_child((pid_t)pid, "clone");
  }
  close(lfd);
  return failures;
}

/* A child of hidden_clone_server: closes what it inherited, exits (exit
 * handlers run). */
static int close_and_exit(void *arg) {
  const int *fds = arg;
  close(fds[0]);
  close(fds[1]);
  exit(0);
}

/* clone() with glibc's wrapper, or vfork(). */
static pid_t make_child(int use_vfork, int *fds) {
  static char stack[256 << 10] __attribute__((aligned(16)));
  if (use_vfork) {
    pid_t pid = vfork();
    if (pid == 0) {
      close(fds[0]);
      close(fds[1]);
      _exit(0);
    }
    return pid;
  }
  pid_t pid = clone(close_and_exit, stack + sizeof stack, CLONE_NEWIPC | SIGCHLD, fds);
  if (pid < 0 && errno == EPERM) pid = clone(close_and_exit, stack + sizeof stack, SIGCHLD, fds);
  return pid;
}

static int hidden_clone_server(int port, int conns, int use_vfork) {
  int fds[2] = {listen_on(port), -1};
  const char *how = use_vfork ? "vfork()" : "clone()";
  for (int i = 0; i < conns; ++i) {
    fds[1] = accept(fds[0], NULL, NULL);
    CHECK(fds[1] >= 0, "accepted connection %d", i);
    if (fds[1] < 0) break;
    pid_t pid = make_child(use_vfork, fds);
    CHECK(pid > 0, "%s for connection %d", how, i);
    if (pid > 0) wait_child(pid, how);
    CHECK(echo(fds[1]) == 0, "connection %d echoed by the parent after its child closed it", i);
    close(fds[1]);
  }
  close(fds[0]);
  return failures;
}

/* Kills the process on rt_sigaction, allows every other call. */
static int forbid_sigaction(void) {
  struct sock_filter prog[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigaction, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog fprog = {.len = sizeof prog / sizeof prog[0], .filter = prog};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
  return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog);
}

static int seccomp_server(int port) {
  int lfd = listen_on(port);
  int c = accept(lfd, NULL, NULL);
  CHECK(c >= 0, "accepted the connection");
  pid_t pid = fork();
  if (pid == 0) {
    close(lfd);
    if (forbid_sigaction() != 0) exit(2);
    int r = echo(c);
    close(c);
    exit(r == 0 ? 0 : 1);
  }
  CHECK(pid > 0, "fork");
  close(c);
  if (pid > 0) wait_child(pid, "sandboxed");
  close(lfd);
  return failures;
}

static void one_client(int port, int bytes, int i) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "client %d connected", i);
  char out[kChunk], in[kChunk];
  int sent = 0, good = 1;
  while (good && sent < bytes) {
    int n = bytes - sent < kChunk ? bytes - sent : kChunk;
    for (int k = 0; k < n; ++k) out[k] = (char)((sent + k) * 131 + i);
    good = write_all(fd, out, (size_t)n) == 0;
    for (int got = 0; good && got < n;) {
      ssize_t r = read(fd, in + got, (size_t)(n - got));
      if (r < 0 && errno == EINTR) continue;
      good = r > 0;
      if (good) got += (int)r;
    }
    good = good && memcmp(in, out, (size_t)n) == 0;
    if (good) sent += n;
  }
  CHECK(good && sent == bytes, "client %d: %d of %d bytes echoed intact", i, sent, bytes);
  shutdown(fd, SHUT_WR);
  CHECK(read(fd, in, 1) == 0, "client %d: EOF after the echo", i);
  close(fd);
}

static int libfabric_mapped(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[512];
  int mapped = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, "libfabric")) mapped = 1;
  if (f) fclose(f);
  return mapped;
}

static int maps(const char *what, int port) {
  if (strcmp(what, "kernel") == 0) {
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    int x = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK(u >= 0 && x >= 0, "a UDP and a unix socket");
  } else if (strcmp(what, "tcp") == 0) {
    CHECK(socket(AF_INET, SOCK_STREAM, 0) >= 0, "a TCP socket");
  } else if (strcmp(what, "listen") == 0) {
    listen_on(port);
  }
  const int mapped = libfabric_mapped();
  printf("libfabric mapped: %s\n", mapped ? "yes" : "no");
  return mapped;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 4 && strcmp(argv[1], "clone-server") == 0) return clone_server(atoi(argv[2]), atoi(argv[3]));
  if (argc >= 4 && strcmp(argv[1], "hidden-clone-server") == 0)
    return hidden_clone_server(atoi(argv[2]), atoi(argv[3]), 0);
  if (argc >= 4 && strcmp(argv[1], "vfork-server") == 0) return hidden_clone_server(atoi(argv[2]), atoi(argv[3]), 1);
  if (argc >= 3 && strcmp(argv[1], "seccomp-server") == 0) return seccomp_server(atoi(argv[2]));
  if (argc >= 5 && strcmp(argv[1], "client") == 0) {
    for (int i = 0; i < atoi(argv[3]); ++i) one_client(atoi(argv[2]), atoi(argv[4]), i);
    return failures;
  }
  if (argc >= 3 && strcmp(argv[1], "maps") == 0) return maps(argv[2], argc >= 4 ? atoi(argv[3]) : 0);
  fprintf(stderr, "usage: see the comment at the top of sandbox_probe.c\n");
  return 2;
}
