// gpusock's settings: one table (wire/config.cc) of every GPUSOCK_* variable
// with its type, default, range, the rsocket file it stands for, the part of
// gpusock that reads it and a line of doc. Values are read once per process,
// at the first look, with one precedence everywhere:
//   an explicit API option (the caller's, e.g. a ProxyOptions field)
//   > the environment > rsocket's file (GPUSOCK_RSOCKET_CONF_DIR, else
//   /etc/rdma/rsocket) > the default.
// Nothing else in gpusock calls getenv for its own settings; gpusock_info
// lists every setting with its value and where the value came from.
#pragma once

#include <cstdint>
#include <string>

namespace gpusock::config {

enum class Id : int {
  // which transport, and what is said about it
  kTransport,
  kProvider,
  kLog,
  kRsocketConfDir,
  // a socket's rings and queues (rsocket's defaults)
  kMemDefault,
  kWmemDefault,
  kSqSize,
  kRqSize,
  kInline,
  kIomapSize,
  kRingLarge,
  kRingBudgetMb,
  kCloseFlushS,
  kZcopy,
  kZcopyMin,
  kZcopyCacheMb,
  // waiting
  kBusyPollUs,
  kMaxSpinners,
  kReadySetFullMs,
  kSpinLockYield,
  // transports
  kFabricHmem,
  kShmStuckLockMs,
  kShmQueueEntries,
  kShmSpares,
  kTcpCqShare,
  kVerbsDevice,
  // the GPU side
  kProxyThreads,
  kProxyListenerPollUs,
  kGpuInline,
  kHostGpus,
  // the LD_PRELOAD shim
  kPreload,
  kFallback,
  kPorts,
  kExcludePorts,
  kCount
};

enum class Type : uint8_t {
  kInt,    // a number in [lo, hi] (decimal, or 0x.. hex)
  kBool,   // 0/1, off/on, no/yes, false/true
  kLevel,  // warn | info | debug, or 0..3 (the log)
  kText,   // taken as it is
};

enum class Source : uint8_t {
  kDefault,      // nothing said otherwise
  kRsocketFile,  // rsocket's file of that name
  kEnvironment,  // the variable
  kAlias,        // another variable that stands for it (GPUSOCK_PROVIDER)
  kInvalid,      // the variable or file held something out of range: the default is used
};

struct Setting {
  const char *name;  // the environment variable
  Type type;
  long def, lo, hi;          // kInt, kBool, kLevel; def < lo: computed where it is used (doc says how)
  const char *text_default;  // kText: the default ("" none)
  const char *rsocket_file;  // the file under rsocket's directory, or nullptr
  const char *component;     // "socket", "wait", "fabric", "verbs", "proxy", "gpu", "shim", "log"
  const char *doc;
};

const Setting &describe(Id id);

// The value (the table's default when nothing set it).
long get(Id id);
// The value set by the environment or a file, else `fallback` (a default
// computed by the caller: the cores it may use, a device found).
long get_or(Id id, long fallback);
// kText settings.
const std::string &text(Id id);
Source source(Id id);
bool is_set(Id id);  // the environment, an alias or a file said it
// Where the value came from, in words ("environment", the file's path, ...).
std::string source_text(Id id);
// The value as gpusock_info prints it.
std::string value_text(Id id);

// The whole of rsocket's file `name` in its directory (GPUSOCK_RSOCKET_CONF_DIR,
// else /etc/rdma/rsocket); false when it cannot be read. For the files that
// are not one setting (the shim's preload_config).
bool read_rsocket_file(const char *name, std::string *out);

// s without the blanks (spaces, tabs, line ends) around it: how settings and
// rsocket's files are read.
std::string trimmed(const std::string &s);

// Reads everything again: for tests that change variables between checks.
void reload();

}  // namespace gpusock::config
