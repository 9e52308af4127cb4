// gpusock's one logger: a level (GPUSOCK_LOG: warn, info, debug) and a
// component tag on every line, written to stderr with one write(2) so lines
// of several threads and processes do not interleave, and past any write()
// an LD_PRELOAD shim defines.
//   gpusock[1234] socket: transport fabric:shm
#pragma once

namespace gpusock::log {

enum Level : int { kWarn = 0, kInfo = 1, kDebug = 2 };

// Whether a message of this level is written (GPUSOCK_LOG, read once).
bool enabled(Level level);

void write(Level level, const char *component, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

}  // namespace gpusock::log
