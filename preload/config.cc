// Configuration of the shim: rsocket's files (/etc/rdma/rsocket/*, so existing
// deployments keep their tuning) and GPUSOCK_* environment variables. The
// library reads its buffer and queue defaults from GPUSOCK_* variables when its
// engine starts; the files are applied by setting those variables (unless the
// environment already sets them) before the first socket is created.
#include "preload/config.h"

#include "preload/libc.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cctype>
#include <mutex>
#include <string>

namespace gpusock::preload {

namespace {

Config *g_config = nullptr;
std::once_flag g_config_once;

std::string trim(std::string s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

bool read_file(const std::string &path, std::string *out) {
  FILE *f = fopen(path.c_str(), "re");
  if (!f) return false;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  fclose(f);
  return true;
}

// One rsocket value file: a single unsigned number. Applied as the library's
// environment variable unless that is set already.
void apply_value_file(const std::string &dir, const char *file, const char *env, long lo, long hi, long *out) {
  std::string text;
  if (!read_file(dir + "/" + file, &text)) return;
  text = trim(text);
  char *end = nullptr;
  errno = 0;
  const long v = strtol(text.c_str(), &end, 0);
  if (text.empty() || *end != '\0' || errno || v < lo || v > hi) {
    log(0, "ignoring %s/%s: '%s' is not a number in [%ld, %ld]", dir.c_str(), file, text.c_str(), lo, hi);
    return;
  }
  if (out) *out = v;
  if (env && !getenv(env)) {
    setenv(env, std::to_string(v).c_str(), 0);
    log(1, "%s/%s: %s=%ld", dir.c_str(), file, env, v);
  }
}

std::string upper(std::string s) {
  for (auto &c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

int parse_domain(const std::string &w) {
  std::string s = upper(w);
  if (s == "*") return -1;
  if (s.rfind("AF_", 0) == 0 || s.rfind("PF_", 0) == 0) s = s.substr(3);
  if (s == "INET") return AF_INET;
  if (s == "INET6") return AF_INET6;
  if (s == "IB") return 27;  // AF_IB: never matches a socket() we intercept
  return -2;
}

int parse_type(const std::string &w) {
  std::string s = upper(w);
  if (s == "*") return -1;
  if (s.rfind("SOCK_", 0) == 0) s = s.substr(5);
  if (s == "STREAM") return SOCK_STREAM;
  if (s == "DGRAM") return SOCK_DGRAM;
  return -2;
}

int parse_protocol(const std::string &w) {
  std::string s = upper(w);
  if (s == "*") return -1;
  if (s.rfind("IPPROTO_", 0) == 0) s = s.substr(8);
  if (s == "TCP") return 6;
  if (s == "UDP") return 17;
  if (s == "0") return 0;
  return -2;
}

// rsocket's preload_config: "program domain type protocol" per line.
void parse_preload_config(const std::string &dir, Config *c) {
  std::string text;
  if (!read_file(dir + "/preload_config", &text)) return;
  size_t pos = 0;
  int line_no = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = trim(line);
    if (line.empty()) continue;
    char prog[256], dom[64], typ[64], pro[64];
    if (sscanf(line.c_str(), "%255s %63s %63s %63s", prog, dom, typ, pro) != 4) {
      log(0, "%s/preload_config:%d: expected 'program domain type protocol'", dir.c_str(), line_no);
      continue;
    }
    Config::Rule r;
    r.program = prog;
    r.domain = parse_domain(dom);
    r.type = parse_type(typ);
    r.protocol = parse_protocol(pro);
    if (r.domain == -2 || r.type == -2 || r.protocol == -2) {
      log(0, "%s/preload_config:%d: unknown domain, type or protocol", dir.c_str(), line_no);
      continue;
    }
    c->rules.push_back(r);
  }
  if (text.size() && c->rules.empty())
    log(0, "%s/preload_config has no valid line: intercepting everything", dir.c_str());
}

// "80,443,5000-5010" into a 65536-bit map. Returns false on a syntax error.
bool parse_ports(const char *text, std::vector<uint64_t> *map, const char *name) {
  map->assign(65536 / 64, 0);
  std::string s = text;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find_first_of(", ", pos);
    if (comma == std::string::npos) comma = s.size();
    std::string item = trim(s.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    unsigned long lo, hi;
    char *end = nullptr;
    lo = strtoul(item.c_str(), &end, 10);
    if (*end == '-') hi = strtoul(end + 1, &end, 10);
    else hi = lo;
    if (*end != '\0' || lo > 65535 || hi > 65535 || lo > hi) {
      log(0, "%s: ignoring '%s' (expected ports and ranges like 80,5000-5010)", name, item.c_str());
      continue;
    }
    for (unsigned long p = lo; p <= hi; ++p) (*map)[p / 64] |= uint64_t(1) << (p % 64);
  }
  return true;
}

bool in_map(const std::vector<uint64_t> &map, uint16_t port) {
  return !map.empty() && (map[port / 64] >> (port % 64)) & 1;
}

void load() {
  auto *c = new Config();
  if (const char *v = getenv("GPUSOCK_LOG")) {
    if (!strcmp(v, "debug") || !strcmp(v, "2") || !strcmp(v, "3")) c->log_level = 2;
    else if (!strcmp(v, "info") || !strcmp(v, "1")) c->log_level = 1;
  }
  g_config = c;  // log() may run from here on
  if (const char *v = getenv("GPUSOCK_PRELOAD")) {
    if (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no")) c->enabled = false;
  }
  if (const char *v = getenv("GPUSOCK_FALLBACK")) {
    if (!strcasecmp(v, "refuse")) c->refuse = true;
    else if (strcasecmp(v, "tcp") && strcasecmp(v, "kernel") && *v)
      log(0, "GPUSOCK_FALLBACK=%s: expected 'tcp' or 'refuse'; using tcp", v);
  }
  // GPUSOCK_PROVIDER=tcp|shm is shorthand for GPUSOCK_TRANSPORT=fabric:<provider>.
  if (const char *v = getenv("GPUSOCK_PROVIDER"); v && *v && !getenv("GPUSOCK_TRANSPORT")) {
    const std::string t = !strcmp(v, "verbs") ? std::string("verbs") : std::string("fabric:") + v;
    setenv("GPUSOCK_TRANSPORT", t.c_str(), 0);
  }
  if (const char *v = getenv("GPUSOCK_PORTS"); v && *v) c->have_include = parse_ports(v, &c->include, "GPUSOCK_PORTS");
  if (const char *v = getenv("GPUSOCK_EXCLUDE_PORTS"); v && *v) parse_ports(v, &c->exclude, "GPUSOCK_EXCLUDE_PORTS");

  const char *dir_env = getenv("GPUSOCK_RSOCKET_CONF_DIR");
  const std::string dir = dir_env && *dir_env ? dir_env : "/etc/rdma/rsocket";
  long v = 0;
  // mem_default, wmem_default, inline_default, sqsize_default and
  // rqsize_default the library reads itself (wire/socket/engine.cc); rsocket's
  // polling time is the ceiling of the library's spin.
  apply_value_file(dir, "polling_time", "GPUSOCK_BUSY_POLL_US", 0, 10000000, nullptr);
  if (const char *e = getenv("GPUSOCK_IOMAP_SIZE")) {
    c->iomap_size = atoi(e);
  } else {
    v = -1;
    apply_value_file(dir, "iomap_size", nullptr, 0, 65535, &v);
    if (v >= 0) {
      c->iomap_size = static_cast<int>(v);
      log(1, "%s/iomap_size: %ld", dir.c_str(), v);
    }
  }
  parse_preload_config(dir, c);
}

}  // namespace

void init_config() { std::call_once(g_config_once, load); }

const Config &config() {
  if (!g_config) init_config();
  return *g_config;
}

bool port_selected(uint16_t port) {
  const Config &c = config();
  if (in_map(c.exclude, port)) return false;
  if (c.have_include) return in_map(c.include, port);
  return true;
}

bool every_port_selected() {
  const Config &c = config();
  return !c.have_include && c.exclude.empty();
}

bool rules_select(int domain, int type, int protocol) {
  const Config &c = config();
  if (c.rules.empty()) return true;
  const char *prog = program_invocation_short_name;
  type &= ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (protocol == 0) protocol = 6;  // a stream socket's default protocol is TCP
  for (const auto &r : c.rules) {
    if (r.program != "*" && strncasecmp(prog, r.program.c_str(), r.program.size()) != 0) continue;
    if (r.domain != -1 && r.domain != domain) continue;
    if (r.type != -1 && r.type != type) continue;
    if (r.protocol != -1 && r.protocol != 0 && r.protocol != protocol) continue;
    return true;
  }
  return false;
}

void log(int level, const char *fmt, ...) {
  const int want = g_config ? g_config->log_level : 0;
  if (level > want) return;
  char line[600];
  int n = snprintf(line, sizeof line, "gpusock-preload[%d]: ", static_cast<int>(getpid()));
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  if (n > static_cast<int>(sizeof line) - 2) n = sizeof line - 2;
  line[n++] = '\n';
  const int saved = errno;
  ssize_t w = real().write(2, line, static_cast<size_t>(n));
  (void)w;
  errno = saved;
}

}  // namespace gpusock::preload
