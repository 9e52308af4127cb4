/* gpusock status contract: one convention at every boundary.
 *
 *   >= 0  success (a count or a handle where the call returns one)
 *   <  0  failure, the negated errno value (-EAGAIN is back-pressure)
 *
 * The C ABI (gs_* calls) additionally sets errno to the same positive value,
 * so code written for POSIX sockets can test either. No C++ exception ever
 * crosses a gpusock boundary. */
#ifndef GPUSOCK_STATUS_H
#define GPUSOCK_STATUS_H

#include <errno.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int gs_status_t;

/* A short, static, human-readable name for a status, e.g. "EAGAIN". */
const char *gs_status_name(gs_status_t status);

#ifdef __cplusplus
}
#endif

#endif
