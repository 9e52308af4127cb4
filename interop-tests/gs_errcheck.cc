// gs_errcheck: checks that gpusock reports the errors users will hit clearly,
// through the status contract (negative errno + errno) and gs_last_error().
//   gs_errcheck socket                 gs_socket() (no verbs device: run with
//                                      GPUSOCK_TRANSPORT=verbs where there is none)
//   gs_errcheck connect ADDR PORT      a blocking gs_connect()
// Options: --expect E1[,E2...]  the errno names that count as a clear report
//          --msg TEXT           gs_last_error() must contain TEXT (repeatable
//                               as --msg "a|b": any of the alternatives)
// Prints "RESULT PASS|FAIL ..." with the call's status, errno, SO_ERROR and
// gs_last_error(); exit status 0 on PASS.
#include "interop-tests/common.h"

#include <gpusock/socket.h>

#include <sstream>

using namespace interop;

namespace {

bool contains_any(const std::string &hay, const std::string &alts) {
  if (alts.empty()) return true;
  std::stringstream ss(alts);
  std::string alt;
  while (std::getline(ss, alt, '|'))
    if (!alt.empty() && hay.find(alt) != std::string::npos) return true;
  return false;
}

bool errno_expected(int rc, const std::string &list) {
  std::stringstream ss(list);
  std::string e;
  while (std::getline(ss, e, ','))
    if (e == errname(rc)) return true;
  return false;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s socket | connect ADDR PORT  [--expect ENAME,...] [--msg 'text|text']\n", argv[0]);
    return 2;
  }
  const std::string what = argv[1];
  Args a(argc, argv, 2);
  const std::string expect = a.str("expect"), msg = a.str("msg");
  int rc = 0, err_after = 0, so_error = 0;
  std::string call;
  const double t0 = now_s();
  int fd = gs_socket(AF_INET, SOCK_STREAM, 0);
  if (what == "socket") {
    call = "gs_socket(AF_INET, SOCK_STREAM)";
    rc = fd < 0 ? fd : 0;
    err_after = errno;
  } else if (what == "connect" && a.positional().size() == 2) {
    const std::string host = a.positional()[0];
    const int port = std::atoi(a.positional()[1].c_str());
    call = "gs_connect(" + host + ":" + std::to_string(port) + ")";
    if (fd < 0) {
      rc = fd;
      call = "gs_socket (before connect)";
    } else {
      const sockaddr_in sa = make_addr(host.c_str(), port);
      rc = gs_connect(fd, reinterpret_cast<const sockaddr *>(&sa), sizeof sa);
      err_after = errno;
      socklen_t len = sizeof so_error;
      gs_getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    }
  } else {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  const double dt = now_s() - t0;
  const std::string le = gs_last_error();
  bool pass = rc < 0 && errno_expected(rc, expect) && err_after == -rc && contains_any(le, msg);
  std::printf("RESULT %s %s -> %s (errno %s) after %.2fs; SO_ERROR=%s; gs_last_error=\"%s\"", pass ? "PASS" : "FAIL",
              call.c_str(), rc < 0 ? errname(rc) : "0 (success)", err_after ? errname(err_after) : "0", dt,
              so_error ? errname(so_error) : "0", le.c_str());
  if (!pass) {
    std::printf(" [wanted: status in {%s}, errno == -status%s%s%s]", expect.c_str(),
                msg.empty() ? "" : ", gs_last_error containing \"", msg.c_str(), msg.empty() ? "" : "\"");
  }
  std::printf("\n");
  if (fd >= 0) gs_close(fd);
  return pass ? 0 : 1;
}
