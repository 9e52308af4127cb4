#include "wire/socket/unmap_monitor.h"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

namespace gpusock::socket {

namespace {

#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif

constexpr uint64_t kEvents = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;

// User-mode-only first: it needs no privilege (vm.unprivileged_userfaultfd=0)
// and we never take faults anyway.
int open_userfaultfd() {
  int fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
  if (fd < 0) fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (fd < 0) return -1;
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = kEvents;
  if (ioctl(fd, UFFDIO_API, &api) != 0 || (api.features & kEvents) != kEvents) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

UnmapMonitor *UnmapMonitor::get() {
  static UnmapMonitor *const monitor = create();
  return monitor != nullptr && monitor->owner_pid_ == getpid() ? monitor : nullptr;
}

// Never destroyed: munmap calls at exit still need a reader.
UnmapMonitor *UnmapMonitor::create() {
  const int fd = open_userfaultfd();
  if (fd < 0) return nullptr;
  auto *m = new UnmapMonitor(fd);
  m->owner_pid_ = getpid();
  // The thread takes no signals: they stay the application's threads' own.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread([m] { m->run(); }).detach();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return m;
}

bool UnmapMonitor::watch(AddressRange range) {
  uffdio_register reg{};
  reg.range.start = range.start;
  reg.range.len = range.end - range.start;
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  return ioctl(fd_, UFFDIO_REGISTER, &reg) == 0;
}

void UnmapMonitor::unwatch(AddressRange range) {
  uffdio_range r{range.start, range.end - range.start};
  ioctl(fd_, UFFDIO_UNREGISTER, &r);  // fails harmlessly where the range is gone
}

void UnmapMonitor::record(AddressRange range) {
  std::lock_guard lock(log_mu_);
  log_[seq_ % kLogSize] = range;
  ++seq_;
}

void UnmapMonitor::run() {
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, -1) < 0) continue;
    reading_.store(true);
    uffd_msg msg;
    while (read(fd_, &msg, sizeof msg) == static_cast<ssize_t>(sizeof msg)) {
      switch (msg.event) {
        case UFFD_EVENT_UNMAP:
        case UFFD_EVENT_REMOVE:
          record({static_cast<uintptr_t>(msg.arg.remove.start), static_cast<uintptr_t>(msg.arg.remove.end)});
          break;
        case UFFD_EVENT_REMAP:
          record({static_cast<uintptr_t>(msg.arg.remap.from),
                  static_cast<uintptr_t>(msg.arg.remap.from + msg.arg.remap.len)});
          break;
        case UFFD_EVENT_PAGEFAULT: {
          // Not expected (no page is write-protected): let the thread go on.
          uffdio_range page{msg.arg.pagefault.address & ~uint64_t(4095), 4096};
          ioctl(fd_, UFFDIO_WAKE, &page);
          break;
        }
        default:
          break;
      }
    }
    reading_.store(false);
  }
}

uint64_t UnmapMonitor::sequence() {
  while (reading_.load()) std::this_thread::yield();
  std::lock_guard lock(log_mu_);
  return seq_;
}

int UnmapMonitor::changes_since(uint64_t *cursor, AddressRange *out, int max) {
  while (reading_.load()) std::this_thread::yield();
  std::lock_guard lock(log_mu_);
  if (seq_ - *cursor > kLogSize) {
    *cursor = seq_;
    return -1;
  }
  int n = 0;
  for (; n < max && *cursor != seq_; ++n, ++*cursor) out[n] = log_[*cursor % kLogSize];
  return n;
}

}  // namespace gpusock::socket
