/* Helpers shared by the test programs of the shim (preload_probe.c,
 * prefork_probe.c): plain POSIX, no gpusock headers. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <unistd.h>

/* Writes all n bytes (retrying after EINTR): 0, or -1 with errno. */
static inline int write_all(int fd, const void *buf, size_t n) {
  const char *p = (const char *)buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}
