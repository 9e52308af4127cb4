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
#include "test-support/peer_modes.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

using namespace gpusock::test;

int main(int argc, char **argv) {
  peer_signals();
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s echo|gated-echo|sink|blast|stall|listen|hold PORT [ARG]\n", argv[0]);
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
  if (mode == "blast") {
    const int fd = connect_retry(at, RetryPolicy{.seconds = 5, .pause_ms = 10, .any_error = true});
    return fd < 0 ? 5 : blast(fd);
  }
  return 1;
}
