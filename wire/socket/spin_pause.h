// One step of a busy-poll, inline: every spinning wait of the CPU sockets (a
// blocking call's, gs_poll's, a slot lock of the fd table) takes its steps
// here.
#pragma once

#include <sched.h>

namespace gpusock::socket {

// A pause instruction, and every 64th step a yield, so a spinning caller
// costs no system call per poll yet still lets a peer (or a lock holder) on
// an oversubscribed machine run. One pause, not eight: data that lands
// during the pauses waits for them to end, and eight (~0.2 us on an EPYC,
// more where a pause is 140 cycles) made the shm round trip ~17 % slower
// (docs/performance.md).
inline void spin_pause(unsigned step) {
  if (step % 64 == 63) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace gpusock::socket
