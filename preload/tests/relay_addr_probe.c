/* relay_addr_probe: what a forked child learns about the connection it was
 * handed (under the shim a fork relay carries it), as on kernel TCP.
 *
 *   relay_addr_probe server PORT     accept one connection, fork a child that
 *                                    checks the connection's names, then execs
 *                                    "child" on the same fd, which checks again
 *                                    and replies with what it saw
 *   relay_addr_probe child FD LOCAL_PORT PEER_PORT    (the exec'd child)
 *   relay_addr_probe client PORT     connect, compare the reply with the
 *                                    connection's own addresses
 *
 * The checks: getsockname/getpeername give AF_INET 127.0.0.1 and the
 * connection's ports (also into a sockaddr_in-sized buffer and on a dup),
 * SO_DOMAIN AF_INET, SO_PROTOCOL IPPROTO_TCP, SO_TYPE SOCK_STREAM, SO_PEERCRED
 * no process (pid 0, as TCP has no peer credentials), TCP_NODELAY can be set,
 * sendto with the peer's address sends (TCP ignores the address).
 * Exit status: the number of failed checks. EXPECT_GPUSOCK=1: the server's
 * accepted socket must be a gpusock socket. */
#define _GNU_SOURCE
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "probe_check.h"
#include "probe_io.h"

static const char *self_path;

/* "127.0.0.1:PORT" of an AF_INET address, else the family's number. */
static void addr_text(const struct sockaddr_storage *ss, socklen_t len, char *out, size_t n) {
  const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
  char ip[INET_ADDRSTRLEN] = "?";
  if (ss->ss_family != AF_INET || len != sizeof *a) {
    snprintf(out, n, "family %d, length %u", ss->ss_family, (unsigned)len);
    return;
  }
  inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
  snprintf(out, n, "%s:%u", ip, ntohs(a->sin_port));
}

/* The local (peer = 0) or peer address of fd as text; the call's result in *rc. */
static void name_of(int fd, int peer, char *out, size_t n, int *rc) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len = sizeof ss;
  *rc = peer ? getpeername(fd, (struct sockaddr *)&ss, &len) : getsockname(fd, (struct sockaddr *)&ss, &len);
  addr_text(&ss, len, out, n);
}

static int int_option(int fd, int level, int name) {
  int v = -1;
  socklen_t len = sizeof v;
  return getsockopt(fd, level, name, &v, &len) == 0 ? v : -1000 - errno;
}

/* What `who` must see on fd: local 127.0.0.1:local_port, peer 127.0.0.1:peer_port. */
static void check_names(int fd, int local_port, int peer_port, const char *who) {
  char want_local[32], want_peer[32], got[64];
  snprintf(want_local, sizeof want_local, "127.0.0.1:%d", local_port);
  snprintf(want_peer, sizeof want_peer, "127.0.0.1:%d", peer_port);
  int rc;
  name_of(fd, 0, got, sizeof got, &rc);
  CHECK(rc == 0 && !strcmp(got, want_local), "%s: getsockname %s (want %s)", who, got, want_local);
  name_of(fd, 1, got, sizeof got, &rc);
  CHECK(rc == 0 && !strcmp(got, want_peer), "%s: getpeername %s (want %s)", who, got, want_peer);
  struct sockaddr_in small;
  socklen_t len = sizeof small;
  CHECK(getpeername(fd, (struct sockaddr *)&small, &len) == 0 && len == sizeof small && small.sin_family == AF_INET &&
            ntohs(small.sin_port) == peer_port,
        "%s: getpeername into a sockaddr_in", who);
  const int d = dup(fd);
  name_of(d, 1, got, sizeof got, &rc);
  CHECK(rc == 0 && !strcmp(got, want_peer), "%s: getpeername of a dup %s", who, got);
  close(d);
  CHECK(int_option(fd, SOL_SOCKET, SO_DOMAIN) == AF_INET, "%s: SO_DOMAIN AF_INET (%d)", who,
        int_option(fd, SOL_SOCKET, SO_DOMAIN));
  CHECK(int_option(fd, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_TCP, "%s: SO_PROTOCOL IPPROTO_TCP (%d)", who,
        int_option(fd, SOL_SOCKET, SO_PROTOCOL));
  CHECK(int_option(fd, SOL_SOCKET, SO_TYPE) == SOCK_STREAM, "%s: SO_TYPE SOCK_STREAM", who);
  struct ucred cred = {1, 1, 1};
  len = sizeof cred;
  CHECK(getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.pid == 0,
        "%s: SO_PEERCRED names no process (pid %d)", who, (int)cred.pid);
  const int one = 1;
  CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "%s: TCP_NODELAY can be set", who);
}

static int port_of(int fd, int peer) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  if ((peer ? getpeername(fd, (struct sockaddr *)&a, &len) : getsockname(fd, (struct sockaddr *)&a, &len)) < 0)
    return -1;
  return ntohs(a.sin_port);
}

static int server(int port) {
  const int l = tcp_listen(port, SOCK_CLOEXEC);
  CHECK(l >= 0, "server listening on 127.0.0.1:%d", port);
  if (l < 0) return 1;
  const int c = accept(l, NULL, NULL);
  CHECK(c >= 0, "server: accepted a connection");
  if (c < 0) return 1;
  if (expect_gpusock()) CHECK(fd_is_gpusock(c), "server: the accepted fd %d is a gpusock socket", c);
  const int peer_port = port_of(c, 1);
  check_names(c, port, peer_port, "server");
  const pid_t pid = fork();
  if (pid == 0) {
    check_names(c, port, peer_port, "forked child");
    char fd_text[16], local_text[16], peer_text[16];
    snprintf(fd_text, sizeof fd_text, "%d", c);
    snprintf(local_text, sizeof local_text, "%d", port);
    snprintf(peer_text, sizeof peer_text, "%d", peer_port);
    if (failures) _exit(failures);
    execl(self_path, self_path, "child", fd_text, local_text, peer_text, (char *)NULL);
    _exit(127);
  }
  close(c); /* the child owns the connection now */
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "server: the child's checks passed (status %d)", status);
  close(l);
  return failures;
}

static int child(int fd, int local_port, int peer_port) {
  check_names(fd, local_port, peer_port, "exec'd child");
  char local[64], peer[64], line[160];
  int rc;
  name_of(fd, 0, local, sizeof local, &rc);
  name_of(fd, 1, peer, sizeof peer, &rc);
  const int n = snprintf(line, sizeof line, "local %s peer %s\n", local, peer);
  /* TCP ignores the address of a sendto on a connected socket. */
  struct sockaddr_storage to;
  socklen_t to_len = sizeof to;
  getpeername(fd, (struct sockaddr *)&to, &to_len);
  CHECK(sendto(fd, line, (size_t)n, 0, (struct sockaddr *)&to, to_len) == n,
        "exec'd child: replied '%.*s' with sendto to the peer's address", n - 1, line);
  close(fd);
  return failures;
}

static int client(int port) {
  const int fd = tcp_connect(port, 0);
  CHECK(fd >= 0, "client connected to 127.0.0.1:%d", port);
  if (fd < 0) return 1;
  char line[160], want[160];
  size_t i = 0;
  while (i < sizeof line - 1 && read(fd, line + i, 1) == 1 && line[i] != '\n') ++i;
  line[i] = 0;
  /* The server's local address is our peer, its peer is us. */
  snprintf(want, sizeof want, "local 127.0.0.1:%d peer 127.0.0.1:%d", port_of(fd, 1), port_of(fd, 0));
  CHECK(!strcmp(line, want), "client: the server's child saw '%s' (want '%s')", line, want);
  close(fd);
  return failures;
}

int main(int argc, char **argv) {
  self_path = argv[0];
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 3 && !strcmp(argv[1], "server")) return server(atoi(argv[2]));
  if (argc >= 5 && !strcmp(argv[1], "child")) return child(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
  if (argc >= 3 && !strcmp(argv[1], "client")) return client(atoi(argv[2]));
  fprintf(stderr, "usage: see the top of relay_addr_probe.c\n");
  return 2;
}
