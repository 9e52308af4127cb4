// Names that "fabric:shm" puts in /dev/shm, and what is left there by processes
// that died without cleaning up (SIGKILL, a crash).
//
// Endpoint regions. shm creates /dev/shm/<name> for every endpoint and unlinks
// it in fi_close, so a killed process leaves its regions behind. A name made of
// the pid alone would then collide when the pid is reused: shm 1.17's
// smr_create opens the name with O_EXCL, finds the stale region, sees its pid
// alive (it is the new process itself) and fails with -FI_EBUSY (unlinking the
// file on the way), so the new process's endpoint creation fails. Names are
// therefore
//
//     gpusock-ep-<pid>-<start>-<tag>-<seq>
//
// <start> is the process's start time (field 22 of /proc/<pid>/stat, clock
// ticks since boot): pid and start time together name one process for the
// whole uptime, so "is the owner of this file alive?" has an exact answer even
// after the pid has been reused. <tag> is 32 random bits chosen per process (a
// second guard, e.g. for containers that share /dev/shm), <seq> counts the
// process's endpoints (never reused: shm keeps a process-wide list of the names
// it created). Names of the older form gpusock-ep-<pid>-<seq> are still
// understood (owner alive unless the pid is gone).
//
// Bells. Every endpoint's bell socket (shm_bell.h) is /dev/shm/<endpoint
// name>.bell, owned like the region; a killed process leaves it behind too.
// So is a process's hint board (shm_hints.h), /dev/shm/<endpoint name>.hints.
//
// Rendezvous files. gpusock-<ip>-<port> names a listener; its owner holds an
// OFD write lock on it and its content names the listener's endpoint (so also
// the owning process). The file is stale when nobody holds the lock, or when
// the process named in it is dead (its lock can outlive it in a child that was
// forked without exec and inherited the descriptor).
//
// Sweeping. Opening a shm domain removes, once per process, the region and
// bell files whose owner is dead and the rendezvous files that are stale; listen() takes
// over a stale rendezvous; a client treats one as "nobody listens".
//
// Liveness is judged through this process's /proc, so processes that share a
// /dev/shm must share a pid namespace (shm itself needs that: its CMA path
// addresses peers by pid).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace gpusock::wire::fabric::shm {

// One process for the whole uptime: pid and start time (0 when /proc cannot
// tell, then the pid alone is used).
struct ProcessId {
  pid_t pid = 0;
  uint64_t start = 0;
};

// This process (recomputed in a forked child).
ProcessId self();

// The start time of `pid`: 1 and *start set; 0 no such process; -1 unknown
// (/proc not readable).
int process_start(pid_t pid, uint64_t *start);

// False only when `id` is known to be dead (gone, or its pid now belongs to a
// process that started at another time). Unknown counts as alive.
bool process_alive(const ProcessId &id);

// A new, never used endpoint name for this process; *seq (optional) its
// sequence number, which is also the number after the last '-'.
std::string new_endpoint_name(uint64_t *seq = nullptr);

// The owner of an endpoint name (either form). False if it is not one.
bool parse_endpoint_name(std::string_view name, ProcessId *owner);

// Is the owner of endpoint region `name` alive? (Not a valid name: true.)
bool endpoint_owner_alive(std::string_view name);

// The bell socket of endpoint `name`: /dev/shm/<name>.bell.
constexpr char kBellSuffix[] = ".bell";
std::string bell_path(const std::string &endpoint_name);

// Removes what endpoint `name` has in /dev/shm (its region and its bell):
// for an owner that died, since only a live owner removes its own.
void unlink_endpoint_files(const std::string &name);

constexpr size_t kNameMax = 64;
constexpr uint32_t kRendezvousMagic = 0x47535256;  // "GSRV"
constexpr uint32_t kRendezvousVersion = 1;
constexpr uint32_t kRendezvousV6Only = 1;  // an IPv6 wildcard listener that takes no IPv4 clients

// Content of a rendezvous file.
struct Rendezvous {
  uint32_t magic;
  uint32_t version;
  int32_t pid;
  uint32_t flags;       // kRendezvousV6Only (older writers left 0)
  char name[kNameMax];  // the listener endpoint
};

std::string rendezvous_name(const std::string &ip, uint16_t port);

// The live listener named by rendezvous `name`: locked, valid, owner alive;
// *owner (if given): the user that owns the file, the listener's.
bool read_rendezvous(const std::string &name, Rendezvous *out, uid_t *owner = nullptr);

// listen(): claim rendezvous `name`. 0 with *fd (locked, empty, close-on-exec);
// -EADDRINUSE when a live listener owns it (or one is being created), with
// *detail saying who; another negated errno if the file cannot be opened.
// A stale file is taken over; the region of the dead listener it named is
// unlinked.
int claim_rendezvous(const std::string &name, int *fd, std::string *detail);

// Removes gpusock's stale files from /dev/shm: regions, bells and boards of dead
// owners, stale rendezvous files. Returns how many it removed.
int sweep_stale_files();

// The sweep above, at most once per process (a forked child sweeps again).
void sweep_stale_files_once();

}  // namespace gpusock::wire::fabric::shm
