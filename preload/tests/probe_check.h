/* What the plain C programs the shim tests run share (preload_probe.c,
 * reliability/odd_calls.c): CHECK prints "ok: ..." or "FAIL: ..." (with the
 * place and errno) and counts the failures; now_ms reads the monotonic clock;
 * expect_gpusock says whether EXPECT_GPUSOCK asks for gpusock sockets.
 * Each program is one source: the definitions are static. */
#pragma once

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (cond) {                                                            \
      printf("ok: " __VA_ARGS__);                                          \
    } else {                                                               \
      printf("FAIL: " __VA_ARGS__);                                        \
      printf("   (%s:%d, errno %s)", __FILE__, __LINE__, strerror(errno)); \
      ++failures;                                                          \
    }                                                                      \
    printf("\n");                                                          \
    fflush(stdout);                                                        \
  } while (0)

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline int expect_gpusock(void) {
  const char *want = getenv("EXPECT_GPUSOCK");
  return want != NULL && atoi(want) != 0;
}
