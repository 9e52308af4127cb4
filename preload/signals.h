// Signals as the shim's waits see them. Every handler the program installs
// (sigaction, signal) is wrapped by a trampoline that counts deliveries per
// thread and remembers SA_RESTART, so the emulated waits return EINTR for a
// signal that arrived while they were spinning, and socket calls restart after
// an SA_RESTART handler as the kernel's do (signal(7)).
#pragma once

#include "preload/libc.h"

namespace gpusock::preload {

// Bumped by the trampoline on each handled signal; whether that handler asked
// for SA_RESTART.
extern thread_local unsigned t_signals __attribute__((tls_model("initial-exec")));
extern thread_local int t_signal_restart __attribute__((tls_model("initial-exec")));

// Restart rule for a gpusock call that returned -EINTR: the kernel restarts
// socket calls after a handler installed with SA_RESTART (signal(7)), unless a
// timeout is set; a wake-up with no handler run is not an interruption at all.
bool restart_after_eintr(unsigned signals_before);

// sigaction() with the program's handler wrapped in the trampoline; `old`
// shows the program its own handler, not the trampoline.
int install_handler(int sig, const struct sigaction *act, struct sigaction *old);

// Gives the default action back to signals a library took over (signals.cc).
void restore_hijacked_signals();

}  // namespace gpusock::preload
