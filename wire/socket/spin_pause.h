// One step of a busy-poll, inline: the spinning waits of the CPU sockets
// take their steps here (a slot lock of the fd table directly; a blocking
// call's and gs_poll's through spin_step in waiting.h, which also watches
// whether another thread wants the core).
#pragma once

#include <sched.h>

namespace gpusock::socket {

// A pause instruction, and every 64th step a yield, so a spinning caller
// costs no system call per poll yet still lets a peer (or a lock holder) on
// an oversubscribed machine run. One pause, not eight: data that lands
// during the pauses waits for them to end, and eight (~0.2 us on an EPYC,
// more where a pause is 140 cycles) made the shm round trip ~17 % slower
// (docs/performance.md).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

inline void spin_pause(unsigned step) {
  if (step % 64 == 63) {
    sched_yield();
    return;
  }
  cpu_relax();
}

}  // namespace gpusock::socket
