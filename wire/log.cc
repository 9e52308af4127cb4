// The logger (wire/log.h).
#include "wire/log.h"

#include "wire/config.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace gpusock::log {

bool enabled(Level level) {
  static const long wanted = config::get(config::Id::kLog);
  return level <= wanted;
}

void write(Level level, const char *component, const char *fmt, ...) {
  if (!enabled(level)) return;
  char line[640];
  int n = std::snprintf(line, sizeof line, "gpusock[%d] %s: ", static_cast<int>(getpid()), component);
  va_list ap;
  va_start(ap, fmt);
  n += std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  if (n > static_cast<int>(sizeof line) - 2) n = static_cast<int>(sizeof line) - 2;
  line[n++] = '\n';
  const int saved = errno;
  (void)syscall(SYS_write, 2, line, static_cast<size_t>(n));
  errno = saved;
}

}  // namespace gpusock::log
