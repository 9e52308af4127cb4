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

// Is this sigaction() or signal() made by a library whose signal calls the
// shim answers without acting on them (signals.cc says which and why)?
// caller: the call's return address; act: its new action, if any (a call the
// library's destructor makes last is a jump: the return address is then the
// dynamic linker's, the action still the library's own).
bool foreign_signal_call(void *caller, const void *act);
// Such a call: the process's dispositions stay as they are; `old` is filled in
// as if the call had been made.
int answer_foreign_signal_call(int sig, struct sigaction *old);

}  // namespace gpusock::preload
