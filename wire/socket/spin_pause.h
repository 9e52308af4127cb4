// One step of a busy-poll, inline: the spinning waits of the CPU sockets
// take their steps here (a slot lock of the fd table directly; a blocking
// call's and gs_poll's through spin_step in waiting.h, which also watches
// whether another thread wants the core).
#pragma once

#include "wire/spin_lock.h"

#include <sched.h>

namespace gpusock::socket {

using wire::cpu_relax;

// A pause instruction, and every 64th step a yield, so a spinning caller
// costs no system call per poll yet still lets a peer (or a lock holder) on
// an oversubscribed machine run. One pause, not several: data that lands
// during the pauses waits for them to end.
inline void spin_pause(unsigned step) {
  if (step % 64 == 63) {
    sched_yield();
    return;
  }
  cpu_relax();
}

}  // namespace gpusock::socket
