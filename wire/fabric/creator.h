// The process that made a transport object. A process made by a clone that
// ran no fork handlers holds copies of its parent's objects as if they were
// its own; tearing one down there (unlinking its files in /dev/shm, taking
// its socket out of an epoll set the processes share, closing its fids) would
// take it from the parent, which goes on using it. Only the creator does.
#pragma once

#include <sys/types.h>
#include <unistd.h>

namespace gpusock::wire::fabric {

class Creator {
 public:
  // Whether the calling process made the object (getpid asks the kernel:
  // glibc caches no pid, so a clone's child gets its own).
  bool here() const { return pid_ == getpid(); }

 private:
  pid_t pid_ = getpid();
};

}  // namespace gpusock::wire::fabric
