// A worker that misbehaves (gpusock's CPU sockets), to check that a
// MapReduce worker facing it fails with a clear error and neither hangs nor
// writes outside its buffers. It plays rank 1 of 2 against a real rank 0: it
// listens on PORT + 1 and connects to PORT like a worker, then
//   bad-hello    says it is rank 7
//   bad-length   announces a region longer than any buffer (2^40 bytes)
//   short        passes the start barrier, then announces 4096 bytes of the
//                shuffle, sends 100 and closes
//   vanish       closes both connections before the first exchange
//
//   mr_bad_worker MODE PORT
// Exit 0 once it did its part (what rank 0 does about it is the test's).
#include "test-support/gs_sockets.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

using namespace gpusock::test;

int main(int argc, char **argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "bad-hello" && mode != "bad-length" && mode != "short" && mode != "vanish") {
    std::fprintf(stderr, "usage: mr_bad_worker bad-hello|bad-length|short|vanish PORT\n");
    return 2;
  }
  const int port = std::atoi(argv[2]);
  const int listener = listen_on(loopback(port + 1), 4);
  RetryPolicy retry;
  retry.seconds = 60;
  const int out = connect_retry(loopback(port), retry);
  if (listener < 0 || out < 0) {
    std::fprintf(stderr, "mr_bad_worker: cannot reach rank 0: %s\n", GsSockets::last_error());
    return 1;
  }
  const int32_t hello = mode == "bad-hello" ? 7 : 1;
  int err = 0;
  send_all(out, &hello, sizeof hello, &err);
  const int in = GsSockets::accept(listener);  // rank 0's connection to us
  int32_t theirs = -1;
  if (in < 0 || !recv_all(in, &theirs, sizeof theirs, &err)) {
    std::fprintf(stderr, "mr_bad_worker: no hello from rank 0 (%d)\n", err);
    return mode == "bad-hello" ? 0 : 1;  // rank 0 may have given up on us already
  }
  if (mode == "bad-length") {
    const uint64_t length = 1ull << 40;
    send_all(out, &length, sizeof length, &err);
  } else if (mode == "short") {
    const uint64_t lengths[2] = {0, 4096};  // the barrier's nothing, then the shuffle's region
    char bytes[100] = {};
    send_all(out, lengths, sizeof lengths, &err);
    send_all(out, bytes, sizeof bytes, &err);
    GsSockets::close(out);  // EOF 3996 bytes early
  }
  // Take what rank 0 sends until it gives up on us and resets the connection.
  if (mode != "vanish") {
    char sink[4096];
    while (GsSockets::recv(in, sink, sizeof sink) > 0) {}
  }
  if (mode != "short") GsSockets::close(out);
  GsSockets::close(in);
  GsSockets::close(listener);
  std::printf("mr_bad_worker: %s done, rank 0 said hello %d\n", mode.c_str(), theirs);
  return 0;
}
