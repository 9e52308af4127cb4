// A real peer process for the socket end-to-end tests: the tests spawn it with
// posix_spawn, so each side of a connection is a separate process with its own
// transport state. Modes (addresses: test_address, so $GPUSOCK_TEST_ADDR counts):
//   echo  PORT          poll-driven, non-blocking echo server for many clients
//   gated-echo PORT     echo, but accept nothing until a byte on stdin (backlog 1024;
//                       "listening" on stdout)
//   sink  PORT          accept one connection, read to EOF, reply "<bytes> <fnv64>"
//   blast PORT          connect and send a pattern until killed
//   stall PORT MS       sink, but read nothing for MS after the accept
//   listen PORT BACKLOG listen with BACKLOG, accept nothing; "listening" on stdout
//   hold PORT           connect, send nothing, wait to be killed
//   send-close PORT N   connect, send N bytes, close and exit at once (the close
//                       still flushing in the background); exits 8 if the
//                       library's background thread outlived its exit handler
#include "test-support/peer_modes.h"
#include "test-support/resources.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace gpusock::test;

namespace {

bool engine_thread_running() {
  for (const ThreadTicks &thread : thread_ticks())
    if (thread.comm == "gs-engine") return true;
  return false;
}

// Registered before the library's own exit handler, so it runs after it: by
// then the background thread must be gone (what it still held would be freed
// after libfabric's destructor). A moment for the kernel to reap it.
void check_engine_stopped() {
  for (int i = 0; i < 50 && engine_thread_running(); ++i) usleep(1000);
  if (engine_thread_running()) _exit(8);
}

}  // namespace

int main(int argc, char **argv) {
  peer_signals();
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s echo|gated-echo|sink|blast|stall|listen|hold|send-close PORT [ARG]\n", argv[0]);
    return 1;
  }
  const std::string mode = argv[1];
  const sockaddr_in at = test_address(std::atoi(argv[2]));
  if (mode == "echo") return echo_server(at, EchoOnClose::kFinishEcho);
  if (mode == "gated-echo") return echo_server(at, EchoOnClose::kFinishEcho, /*gated=*/true);
  if (mode == "sink") return sink_server(at, 1);
  if (mode == "stall" && argc > 3) return sink_server(at, 1, SinkPace{0, std::atoi(argv[3]), false});
  if (mode == "listen" && argc > 3) return idle_listener(at, std::atoi(argv[3]));
  if (mode == "hold") {
    const int fd = connect_retry(at, RetryPolicy{.seconds = 5, .pause_ms = 10, .any_error = true});
    if (fd < 0) return 5;
    for (;;) pause();
  }
  if (mode == "send-close" && argc > 3) {
    std::atexit(check_engine_stopped);
    const int fd = connect_retry(at, RetryPolicy{.seconds = 5, .pause_ms = 10, .any_error = true});
    if (fd < 0) return 5;
    const std::vector<uint8_t> bytes(std::strtoull(argv[3], nullptr, 10), 0x5A);
    if (!send_all(fd, bytes.data(), bytes.size())) return 6;
    return gs_close(fd) == 0 ? 0 : 7;
  }
  if (mode == "blast") {
    const int fd = connect_retry(at, RetryPolicy{.seconds = 5, .pause_ms = 10, .any_error = true});
    return fd < 0 ? 5 : blast(fd);
  }
  return 1;
}
