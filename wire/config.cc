// The settings table and its reader (wire/config.h).
#include "wire/config.h"

#include "wire/core/constants.h"

#include <strings.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace gpusock::config {
namespace {

using wire::kDefaultBufSize;
using wire::kDefaultInline;
using wire::kDefaultRqSize;
using wire::kDefaultSqSize;
using wire::kQpMaxSize;

constexpr long kComputed = -2;  // below every lo: the user of the setting computes its default

// clang-format off
constexpr Setting kTable[] = {
  {"GPUSOCK_TRANSPORT", Type::kText, 0, 0, 0, "", nullptr, "socket",
   "verbs, fabric:tcp or fabric:shm (default: verbs when an RDMA device is present, else fabric:tcp)"},
  {"GPUSOCK_PROVIDER", Type::kText, 0, 0, 0, "", nullptr, "socket",
   "shorthand: tcp or shm means GPUSOCK_TRANSPORT=fabric:<it>, verbs means verbs"},
  {"GPUSOCK_LOG", Type::kLevel, 0, 0, 3, nullptr, nullptr, "log",
   "what is logged to stderr: warn (default), info, debug"},
  {"GPUSOCK_RSOCKET_CONF_DIR", Type::kText, 0, 0, 0, "/etc/rdma/rsocket", nullptr, "socket",
   "where rsocket's configuration files are read"},
  {"GPUSOCK_MEM_DEFAULT", Type::kInt, kDefaultBufSize, 4096, 1 << 30, nullptr, "mem_default", "socket",
   "receive ring of a socket, bytes (unset: grows with use up to GPUSOCK_RING_LARGE)"},
  {"GPUSOCK_WMEM_DEFAULT", Type::kInt, kDefaultBufSize, 4096, 1 << 30, nullptr, "wmem_default", "socket",
   "send ring of a socket, bytes (unset: grows with use up to GPUSOCK_RING_LARGE)"},
  {"GPUSOCK_SQSIZE", Type::kInt, kDefaultSqSize, 16, kQpMaxSize, nullptr, "sqsize_default", "socket",
   "send queue entries of a connection"},
  {"GPUSOCK_RQSIZE", Type::kInt, kDefaultRqSize, 16, kQpMaxSize, nullptr, "rqsize_default", "socket",
   "receive queue entries of a connection"},
  {"GPUSOCK_INLINE", Type::kInt, kDefaultInline, 0, 65535, nullptr, "inline_default", "socket",
   "bytes sent inline with a work request"},
  {"GPUSOCK_IOMAP_SIZE", Type::kInt, kComputed, 0, 65535, nullptr, "iomap_size", "shim",
   "rsocket's iomap entries the shim asks for on each socket (unset: none asked)"},
  {"GPUSOCK_RING_LARGE", Type::kInt, 4 << 20, 0, 1 << 30, nullptr, nullptr, "socket",
   "size an unchosen ring grows to under load, bytes (0: never grows)"},
  {"GPUSOCK_RING_BUDGET_MB", Type::kInt, 64, 0, 1 << 20, nullptr, nullptr, "socket",
   "grown rings a process may hold, MiB"},
  {"GPUSOCK_CLOSE_FLUSH_S", Type::kInt, 10, 0, 3600, nullptr, nullptr, "socket",
   "seconds a closed socket keeps sending what it holds"},
  {"GPUSOCK_ZCOPY", Type::kBool, 1, 0, 1, nullptr, nullptr, "socket", "zero-copy sends of large buffers"},
  {"GPUSOCK_ZCOPY_MIN", Type::kInt, 64 << 10, 4096, 1L << 30, nullptr, nullptr, "socket",
   "smallest send that goes zero-copy, bytes"},
  {"GPUSOCK_ZCOPY_CACHE_MB", Type::kInt, 256, 1, 1 << 20, nullptr, nullptr, "socket",
   "registered user memory kept for zero-copy sends, MiB"},
  {"GPUSOCK_BUSY_POLL_US", Type::kInt, kComputed, 0, 10000000, nullptr, "polling_time", "wait",
   "most a waiting thread spins before it sleeps, us (default: 100; 0 on one core)"},
  {"GPUSOCK_MAX_SPINNERS", Type::kInt, kComputed, 1, 4096, nullptr, nullptr, "wait",
   "threads of a process that spin at once (default: half the cores it may use, at least 1)"},
  {"GPUSOCK_READY_SET_FULL_MS", Type::kInt, 10, 1, 3600000, nullptr, nullptr, "wait",
   "an epoll set looks at every member at least this often, ms"},
  {"GPUSOCK_SPIN_LOCK_YIELD", Type::kBool, 1, 0, 1, nullptr, nullptr, "wait",
   "pthread_spin_lock yields to a preempted holder (0: glibc's plain spinning)"},
  {"GPUSOCK_FABRIC_HMEM", Type::kBool, 0, 0, 1, nullptr, nullptr, "fabric",
   "ask libfabric for device memory (FI_HMEM; costs shm its inject path)"},
  {"GPUSOCK_SHM_STUCK_LOCK_MS", Type::kInt, 10000, 100, 3600000, nullptr, nullptr, "fabric",
   "a fabric:shm listener's region lock held this long with no command moving is taken for a killed client's, and released, ms"},
  {"GPUSOCK_SHM_QUEUE", Type::kInt, 1024, 16, 1024, nullptr, nullptr, "fabric",
   "entries in each fabric:shm connection endpoint's transmit and receive queues (~1.5 KiB of memory each; a connection grants at most this less 4 credits; fewer entries, more of each new region zero-filled at set-up)"},
  {"GPUSOCK_SHM_SPARES", Type::kInt, 2, 0, 64, nullptr, nullptr, "fabric",
   "fabric:shm endpoints a process that keeps opening them has opened ahead, by a thread of its domain (0: none)"},
  {"GPUSOCK_TCP_CQ_SHARE", Type::kInt, 1, 1, 4096, nullptr, nullptr, "fabric",
   "fabric:tcp connections a thread opens that share a completion queue once the process holds that many (1: a queue each, 3 file descriptors; more: fewer descriptors, but each read of a shared queue progresses every member's socket and wakes the threads asleep on any of them)"},
  {"GPUSOCK_VERBS_DEVICE", Type::kText, 0, 0, 0, "", nullptr, "verbs",
   "the RDMA device verbs uses (default: the first)"},
  {"GPUSOCK_PROXY_THREADS", Type::kInt, 1, 1, 64, nullptr, nullptr, "proxy",
   "threads of a proxy when ProxyOptions::threads is 0"},
  {"GPUSOCK_PROXY_LISTENER_POLL_US", Type::kInt, 20, 0, 1000000, nullptr, nullptr, "proxy",
   "a proxy polls its listeners at most this often, us (ProxyOptions::listener_poll_us < 0)"},
  {"GPUSOCK_GPU_INLINE", Type::kInt, kComputed, 0, 3, nullptr, nullptr, "proxy",
   "small messages inline beside the ring: 1 received, 2 sent, 3 both (default: ProxyOptions)"},
  {"GPUSOCK_HOST_GPUS", Type::kInt, 1, 1, 64, nullptr, nullptr, "gpu",
   "emulated GPUs of the host backend"},
  {"GPUSOCK_PRELOAD", Type::kBool, 1, 0, 1, nullptr, nullptr, "shim",
   "the shim takes sockets (0: it passes everything to libc)"},
  {"GPUSOCK_FALLBACK", Type::kText, 0, 0, 0, "tcp", nullptr, "shim",
   "a socket gpusock cannot take: tcp (kernel TCP) or refuse (fails)"},
  {"GPUSOCK_PORTS", Type::kText, 0, 0, 0, "", nullptr, "shim",
   "only these ports go over gpusock (\"80,5000-5010\"; default: all)"},
  {"GPUSOCK_EXCLUDE_PORTS", Type::kText, 0, 0, 0, "", nullptr, "shim",
   "these ports stay on kernel TCP"},
};
// clang-format on
static_assert(sizeof kTable / sizeof kTable[0] == static_cast<size_t>(Id::kCount), "one row per Id");

struct Value {
  long number = 0;
  std::string text;
  Source source = Source::kDefault;
  std::string from;  // the file's path, or what was wrong
};

// Built at the first look, never destroyed: the shim looks from its
// constructor, before this file's static objects exist, and at-exit code may
// look after they would be gone.
struct State {
  std::mutex mu;
  bool loaded = false;
  Value values[static_cast<size_t>(Id::kCount)];
};
State &state() {
  static State *s = new State;
  return *s;
}

bool parse_number(const std::string &t, long lo, long hi, long *out) {
  if (t.empty()) return false;
  char *end = nullptr;
  errno = 0;
  const long n = std::strtol(t.c_str(), &end, 0);
  if (*end != '\0' || errno != 0 || n < lo || n > hi) return false;
  *out = n;
  return true;
}

bool parse(const Setting &s, const std::string &t, long *out) {
  const char *v = t.c_str();
  switch (s.type) {
    case Type::kBool:
      if (!strcasecmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "yes") || !strcasecmp(v, "true")) *out = 1;
      else if (!strcasecmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") || !strcasecmp(v, "false"))
        *out = 0;
      else return false;
      return true;
    case Type::kLevel:
      if (!strcasecmp(v, "warn") || !strcasecmp(v, "error")) *out = 0;
      else if (!strcasecmp(v, "info")) *out = 1;
      else if (!strcasecmp(v, "debug")) *out = 2;
      else return parse_number(t, s.lo, s.hi, out);
      return true;
    default:
      return parse_number(t, s.lo, s.hi, out);
  }
}

bool read_whole_file(const std::string &path, std::string *out) {
  FILE *f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  std::fclose(f);
  return true;
}

// One setting: the environment, else its rsocket file, else the default.
Value read_one(const Setting &s, const std::string &conf_dir) {
  Value v;
  v.number = s.def;
  if (s.type == Type::kText) v.text = s.text_default;
  const char *env = std::getenv(s.name);
  std::string raw;
  if (env != nullptr && *env != '\0') {
    raw = trimmed(env);
    v.source = Source::kEnvironment;
  } else if (const std::string path = s.rsocket_file ? conf_dir + "/" + s.rsocket_file : std::string();
             !path.empty() && read_whole_file(path, &raw)) {
    raw = trimmed(raw);
    v.source = Source::kRsocketFile;
    v.from = path;
  } else {
    return v;
  }
  if (s.type == Type::kText) {
    v.text = raw;
    return v;
  }
  long n = 0;
  if (parse(s, raw, &n)) {
    v.number = n;
  } else {
    v.from = (v.source == Source::kEnvironment ? std::string(s.name) : v.from) + "='" + raw + "' is not valid";
    v.source = Source::kInvalid;
  }
  return v;
}

void load_locked(State &st) {
  const Value dir = read_one(kTable[static_cast<size_t>(Id::kRsocketConfDir)], "");
  for (size_t i = 0; i < static_cast<size_t>(Id::kCount); ++i) st.values[i] = read_one(kTable[i], dir.text);
  // GPUSOCK_PROVIDER stands for GPUSOCK_TRANSPORT where that is not set.
  Value &transport = st.values[static_cast<size_t>(Id::kTransport)];
  const Value &provider = st.values[static_cast<size_t>(Id::kProvider)];
  if (transport.source == Source::kDefault && provider.source == Source::kEnvironment) {
    transport.text = provider.text == "verbs" ? provider.text : "fabric:" + provider.text;
    transport.source = Source::kAlias;
    transport.from = "GPUSOCK_PROVIDER=" + provider.text;
  }
  st.loaded = true;
}

const Value &value(Id id) {
  State &st = state();
  std::lock_guard lock(st.mu);
  if (!st.loaded) load_locked(st);
  return st.values[static_cast<size_t>(id)];
}

}  // namespace

const Setting &describe(Id id) { return kTable[static_cast<size_t>(id)]; }

long get(Id id) { return value(id).number; }  // an invalid value was left at the default

long get_or(Id id, long fallback) {
  const Value &v = value(id);
  return v.source == Source::kDefault || v.source == Source::kInvalid ? fallback : v.number;
}

const std::string &text(Id id) { return value(id).text; }

Source source(Id id) { return value(id).source; }

bool is_set(Id id) {
  const Source s = source(id);
  return s == Source::kEnvironment || s == Source::kRsocketFile || s == Source::kAlias;
}

std::string source_text(Id id) {
  const Value &v = value(id);
  switch (v.source) {
    case Source::kDefault:
      return "default";
    case Source::kEnvironment:
      return "environment";
    case Source::kRsocketFile:
    case Source::kAlias:
      return v.from;
    case Source::kInvalid:
      return "default (" + v.from + ")";
  }
  return "?";
}

std::string value_text(Id id) {
  const Setting &s = describe(id);
  const Value &v = value(id);
  if (s.type == Type::kText) return v.text.empty() ? "(none)" : v.text;
  const long n = get(id);
  if (n < s.lo && !is_set(id)) return "(computed)";
  if (s.type == Type::kBool) return n ? "1" : "0";
  if (s.type == Type::kLevel) return n == 0 ? "warn" : n == 1 ? "info" : "debug";
  return std::to_string(n);
}

bool read_rsocket_file(const char *name, std::string *out) {
  return read_whole_file(text(Id::kRsocketConfDir) + "/" + name, out);
}

void reload() {
  State &st = state();
  std::lock_guard lock(st.mu);
  load_locked(st);
}

std::string trimmed(const std::string &s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  const size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace gpusock::config
