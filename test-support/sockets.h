// Socket helpers of the tests and their peers, over any socket API: an Api
// type whose static functions return >= 0 or a negated errno (GsSockets in
// gs_sockets.h for gpusock; interop-tests/xfer_peer.cc has one for rdma-core's
// rsocket). Only libc headers here: programs built without gpusock use it too.
//   socket(type_flags)  bind(fd, sockaddr_in)  listen(fd, backlog)
//   connect(fd, sockaddr_in)  close(fd)  send(fd, p, n)  recv(fd, p, n)
//   setsockopt(fd, level, name, value, len)
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "test-support/timing.h"

namespace gpusock::test {

struct GsSockets;  // gs_sockets.h: the API the helpers below use by default

inline sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Loopback, or $GPUSOCK_TEST_ADDR: verbs cannot use loopback (rdma_cm has no
// device there), so tests in the Soft-RoCE guest name the guest NIC's address.
inline sockaddr_in test_address(int port) {
  sockaddr_in a = loopback(port);
  const char *addr = std::getenv("GPUSOCK_TEST_ADDR");
  if (addr && *addr) inet_pton(AF_INET, addr, &a.sin_addr);
  return a;
}

// A TCP port that is free now (the kernel's choice; for fabric:shm the number
// only names the endpoint), 0 if none. With `holders` the port stays bound
// until the caller closes those fds, so that ports picked in a row differ.
inline int free_port(std::vector<int> *holders = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = loopback(0);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  if (holders) holders->push_back(fd);
  else ::close(fd);
  return ntohs(a.sin_port);
}

// Moves n bytes through io(p, left) until all went; false on an error or a
// 0 return, with *err = the error (or zero_status for the 0).
template <class Byte, class Io>
bool move_all(Byte *p, size_t n, Io io, int zero_status, int *err) {
  while (n > 0) {
    const ssize_t k = io(p, n);
    if (k <= 0) {
      if (err) *err = k < 0 ? static_cast<int>(k) : zero_status;
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

template <class Api = GsSockets>
bool send_all(int fd, const void *p, size_t n, int *err = nullptr) {
  return move_all(
      static_cast<const uint8_t *>(p), n, [fd](const uint8_t *b, size_t k) { return Api::send(fd, b, k); }, -EPIPE,
      err);
}

// False also on EOF before n bytes (*err = -ECONNRESET then).
template <class Api = GsSockets>
bool recv_all(int fd, void *p, size_t n, int *err = nullptr) {
  return move_all(
      static_cast<uint8_t *>(p), n, [fd](uint8_t *b, size_t k) { return Api::recv(fd, b, k); }, -ECONNRESET, err);
}

// A listening socket (SO_REUSEADDR) on `at`: its fd, or the status of the
// call that failed, named in *failed_call.
template <class Api = GsSockets>
int listen_on(const sockaddr_in &at, int backlog, int type_flags = 0, const char **failed_call = nullptr) {
  const int fd = Api::socket(type_flags);
  if (fd < 0) {
    if (failed_call) *failed_call = "socket";
    return fd;
  }
  int one = 1;
  Api::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const char *call = "bind";
  int rc = Api::bind(fd, at);
  if (rc == 0) {
    call = "listen";
    rc = Api::listen(fd, backlog);
  }
  if (rc == 0) return fd;
  if (failed_call) *failed_call = call;
  Api::close(fd);
  return rc;
}

// How connect_retry waits for a peer that is not listening yet.
struct RetryPolicy {
  double seconds = 10;     // give up after this long (0: one attempt)
  int pause_ms = 10;       // between attempts
  bool any_error = false;  // retry every failed connect, not only ECONNREFUSED
  int type_flags = 0;      // e.g. SOCK_NONBLOCK (EINPROGRESS then counts as connected)
};

// Connects to `to`: the fd, or the status of the call that failed last,
// named in *failed_call ("socket" or "connect").
template <class Api = GsSockets>
int connect_retry(const sockaddr_in &to, const RetryPolicy &policy, const char **failed_call = nullptr) {
  const Deadline deadline(policy.seconds);
  for (;;) {
    const int fd = Api::socket(policy.type_flags);
    if (fd < 0) {
      if (failed_call) *failed_call = "socket";
      return fd;
    }
    const int rc = Api::connect(fd, to);
    if (rc == 0 || rc == -EINPROGRESS) return fd;
    Api::close(fd);
    if ((rc != -ECONNREFUSED && !policy.any_error) || deadline.passed()) {
      if (failed_call) *failed_call = "connect";
      return rc;
    }
    usleep(static_cast<useconds_t>(policy.pause_ms) * 1000);
  }
}

}  // namespace gpusock::test
