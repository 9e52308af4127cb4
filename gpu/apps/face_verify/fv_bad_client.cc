// Face verification: bad input against a server (plain sockets, run under the
// shim). Each case opens its own connection, misbehaves, and checks what the
// server does: an error reply with the right reason and/or a closed
// connection, never a hang; then a well-formed request on a fresh connection
// must still be answered. Run it while fv_client checks good traffic on other
// connections: nobody else may notice.
//
//   fv_bad_client --server A.B.C.D:PORT [--size 64] [--timeout-ms 10000]
// Prints "ok: <case>" or "FAIL: <case>: why"; exit status 0 when all passed.
#include "fv_dataset.h"
#include "fv_net.h"
#include "fv_wire.h"

#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

namespace fv {
namespace {

sockaddr_in g_server;
int g_timeout_ms = 10000;
uint32_t g_size = 64;
int g_failures = 0;

void report(const std::string &what, const std::string &why) {
  if (why.empty()) {
    std::printf("ok: %s\n", what.c_str());
  } else {
    std::printf("FAIL: %s: %s\n", what.c_str(), why.c_str());
    ++g_failures;
  }
  std::fflush(stdout);
}

int open_conn() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, (const sockaddr *)&g_server, sizeof g_server) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

std::vector<uint8_t> request(uint64_t id, uint32_t identity, uint32_t w, uint32_t h, uint32_t magic = kRequestMagic,
                             uint16_t version = kVersion) {
  std::vector<uint8_t> r(kRequestHeaderBytes + size_t(w) * h);
  encode_request_header(
      RequestHeader{magic, version, 0, id, identity, static_cast<uint16_t>(w), static_cast<uint16_t>(h)}, r.data());
  if (w <= kMaxDim && h <= kMaxDim) probe_image(1, identity, id, w, h, r.data() + kRequestHeaderBytes);
  return r;
}

// Reads until EOF/reset; collects what came. "" or why it did not end.
std::string read_to_end(int fd, std::vector<uint8_t> *got) {
  uint8_t buf[4096];
  for (;;) {
    const long k = recv_some<LibcIo>(fd, buf, sizeof buf, g_timeout_ms);
    if (k == 0 || k == -ECONNRESET || k == -EPIPE) return "";
    if (k < 0) return std::string("the server neither answered nor closed: ") + strerror(int(-k));
    got->insert(got->end(), buf, buf + k);
  }
}

// Sends `bytes`; expects an error reply with `reason` (when given) then EOF.
void expect_rejected(const std::string &what, const std::vector<uint8_t> &bytes, uint64_t id, Reason reason) {
  const int fd = open_conn();
  if (fd < 0) return report(what, "connect failed");
  send_all<LibcIo>(fd, bytes.data(), bytes.size(), g_timeout_ms);  // the server may close before all is sent
  std::vector<uint8_t> got;
  std::string why = read_to_end(fd, &got);
  Reply r{};
  if (why.empty() && !got.empty()) {
    if (got.size() != kReplyBytes || !decode_reply(got.data(), &r)) why = "bytes that are not one reply";
    else if (r.verdict != kError || r.reason != reason || r.request_id != id)
      why = std::string("reply ") + verdict_name(r.verdict) + "/" + reason_name(r.reason);
  }
  close(fd);
  report(what + (got.empty() ? " (closed)" : " (error reply, closed)"), why);
}

// Sends a prefix of a good request, then closes (or first waits).
void truncated(const std::string &what, size_t bytes, int wait_ms) {
  const int fd = open_conn();
  if (fd < 0) return report(what, "connect failed");
  const auto r = request(7, 1, g_size, g_size);
  send_all<LibcIo>(fd, r.data(), bytes, g_timeout_ms);
  if (wait_ms > 0) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, wait_ms) > 0) {
      uint8_t b;
      if (recv(fd, &b, 1, 0) > 0) return report(what, "a reply to half a request"), void(close(fd));
    }
  }
  close(fd);
  report(what, "");
}

// Requests the client never reads the replies of, then a vanishing client.
void unread_replies(const std::string &what, int n) {
  const int fd = open_conn();
  if (fd < 0) return report(what, "connect failed");
  for (int i = 0; i < n; ++i) {
    const auto r = request(100 + i, 2, g_size, g_size);
    if (send_all<LibcIo>(fd, r.data(), r.size(), g_timeout_ms) < 0) break;  // the server may drop us
  }
  close(fd);
  report(what, "");
}

void still_serves(const std::string &what) {
  const int fd = open_conn();
  if (fd < 0) return report(what, "connect failed");
  const auto r = request(4242, 0, g_size, g_size);
  uint8_t bytes[kReplyBytes];
  std::string why;
  size_t got = 0;
  if (send_all<LibcIo>(fd, r.data(), r.size(), g_timeout_ms) < 0) why = "send failed";
  while (why.empty() && got < sizeof bytes) {
    const long k = recv_some<LibcIo>(fd, bytes + got, sizeof bytes - got, g_timeout_ms);
    if (k <= 0) why = "no reply";
    else got += static_cast<size_t>(k);
  }
  Reply rep{};
  if (why.empty() && (!decode_reply(bytes, &rep) || rep.request_id != 4242 || rep.verdict == kError))
    why = std::string("reply ") + verdict_name(rep.verdict) + "/" + reason_name(rep.reason);
  close(fd);
  report(what, why);
}

}  // namespace
}  // namespace fv

int main(int argc, char **argv) {
  using namespace fv;
  std::string server = "127.0.0.1:7000";
  Flags flags{argc, argv};
  while (!flags.done()) {
    const std::string n = flags.name();
    if (n == "--server") server = flags.next();
    else if (n == "--size") g_size = static_cast<uint32_t>(flags.number());
    else if (n == "--timeout-ms") g_timeout_ms = static_cast<int>(flags.number());
    else return std::fprintf(stderr, "usage: %s --server A.B.C.D:PORT [--size S] [--timeout-ms MS]\n", argv[0]), 2;
  }
  if (!parse_endpoint(server, &g_server) || g_size < kMinDim || g_size > 256) return 2;
  signal(SIGPIPE, SIG_IGN);

  expect_rejected("bad magic", request(11, 1, g_size, g_size, 0xDEADBEEF), 11, kBadMagic);
  expect_rejected("bad version", request(12, 1, g_size, g_size, kRequestMagic, 9), 12, kBadVersion);
  auto big = request(13, 1, 8, 8);
  store_le(big.data() + 20, 2000, 2);  // 2000 x 2000 claimed, 64 bytes sent
  store_le(big.data() + 22, 2000, 2);
  expect_rejected("dimensions over the limit (2000x2000)", big, 13, kBadSize);
  auto tiny = request(14, 1, 8, 8);
  store_le(tiny.data() + 20, 4, 2);
  expect_rejected("dimensions under the limit (4x8)", tiny, 14, kBadSize);
  std::vector<uint8_t> garbage(64 * 1024);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<uint8_t>(mix64(i));
  expect_rejected("64 KiB of garbage", garbage, load_le(garbage.data() + 8, 8), kBadMagic);
  truncated("truncated header, then disconnect", 10, 0);
  truncated("truncated image, then disconnect", kRequestHeaderBytes + g_size * g_size / 2, 0);
  truncated("half a request, a pause, then disconnect", kRequestHeaderBytes + g_size * g_size / 2, 300);
  unread_replies("requests whose replies are never read, then disconnect", 20);
  still_serves("a good request on a new connection is answered");
  std::printf("%d failure(s)\n", g_failures);
  return g_failures ? 1 : 0;
}
