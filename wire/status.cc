// The status unit: names of the negated errno values gpusock returns
// (include/gpusock/status.h). Everything that reports a status links it: the
// CPU socket library, the proxy, the transports' tests.
#include <gpusock/status.h>

extern "C" const char *gs_status_name(gs_status_t status) {
  if (status >= 0) return "OK";
  switch (-status) {
    // clang-format off
#define GS_NAME(e) case e: return #e;
    GS_NAME(EAGAIN) GS_NAME(EPROTO) GS_NAME(EPROTONOSUPPORT) GS_NAME(ECONNREFUSED) GS_NAME(ECONNRESET)
    GS_NAME(ENOTCONN) GS_NAME(EPIPE) GS_NAME(EINVAL) GS_NAME(ENOMEM) GS_NAME(ENODEV) GS_NAME(ENOENT) GS_NAME(EBADF)
    GS_NAME(ENOTSOCK) GS_NAME(EINPROGRESS) GS_NAME(EALREADY) GS_NAME(EISCONN) GS_NAME(EADDRINUSE)
    GS_NAME(EADDRNOTAVAIL) GS_NAME(EAFNOSUPPORT) GS_NAME(ENOPROTOOPT) GS_NAME(ETIMEDOUT) GS_NAME(EINTR) GS_NAME(EIO)
    GS_NAME(ENOTSUP) GS_NAME(EHOSTUNREACH) GS_NAME(ENETUNREACH) GS_NAME(EMSGSIZE) GS_NAME(ECONNABORTED)
    GS_NAME(EFAULT) GS_NAME(ENOSYS) GS_NAME(ESHUTDOWN) GS_NAME(EMFILE) GS_NAME(ENOBUFS)
#undef GS_NAME
        // clang-format on
        default : return "E?";
  }
}
