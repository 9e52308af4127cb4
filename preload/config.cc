// Configuration of the shim: its settings from gpusock's table (wire/config.h:
// the environment, then rsocket's files under /etc/rdma/rsocket, so existing
// deployments keep their tuning) and rsocket's preload_config rules. The
// library reads its own settings from the same table.
#include "preload/config.h"

#include "wire/config.h"
#include "wire/log.h"

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
  if (!config::read_rsocket_file("preload_config", &text)) return;
  size_t pos = 0;
  int line_no = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    line = config::trimmed(line);
    if (line.empty()) continue;
    char prog[256], dom[64], typ[64], pro[64];
    if (sscanf(line.c_str(), "%255s %63s %63s %63s", prog, dom, typ, pro) != 4) {
      log::write(log::kWarn, "shim", "%s/preload_config:%d: expected 'program domain type protocol'", dir.c_str(),
                 line_no);
      continue;
    }
    Config::Rule r;
    r.program = prog;
    r.domain = parse_domain(dom);
    r.type = parse_type(typ);
    r.protocol = parse_protocol(pro);
    if (r.domain == -2 || r.type == -2 || r.protocol == -2) {
      log::write(log::kWarn, "shim", "%s/preload_config:%d: unknown domain, type or protocol", dir.c_str(), line_no);
      continue;
    }
    c->rules.push_back(r);
  }
  if (text.size() && c->rules.empty())
    log::write(log::kWarn, "shim", "%s/preload_config has no valid line: intercepting everything", dir.c_str());
}

// "80,443,5000-5010" into a 65536-bit map. Returns false on a syntax error.
bool parse_ports(const char *text, std::vector<uint64_t> *map, const char *name) {
  map->assign(65536 / 64, 0);
  std::string s = text;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t comma = s.find_first_of(", ", pos);
    if (comma == std::string::npos) comma = s.size();
    std::string item = config::trimmed(s.substr(pos, comma - pos));
    pos = comma + 1;
    if (item.empty()) continue;
    unsigned long lo, hi;
    char *end = nullptr;
    lo = strtoul(item.c_str(), &end, 10);
    if (*end == '-') hi = strtoul(end + 1, &end, 10);
    else hi = lo;
    if (*end != '\0' || lo > 65535 || hi > 65535 || lo > hi) {
      log::write(log::kWarn, "shim", "%s: ignoring '%s' (expected ports and ranges like 80,5000-5010)", name,
                 item.c_str());
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
  using config::Id;
  auto *c = new Config();
  g_config = c;
  c->enabled = config::get(Id::kPreload) != 0;
  const std::string &fallback = config::text(Id::kFallback);
  if (!strcasecmp(fallback.c_str(), "refuse")) c->refuse = true;
  else if (strcasecmp(fallback.c_str(), "tcp") && strcasecmp(fallback.c_str(), "kernel"))
    log::write(log::kWarn, "shim", "GPUSOCK_FALLBACK=%s: expected 'tcp' or 'refuse'; using tcp", fallback.c_str());
  if (const std::string &v = config::text(Id::kPorts); !v.empty())
    c->have_include = parse_ports(v.c_str(), &c->include, "GPUSOCK_PORTS");
  if (const std::string &v = config::text(Id::kExcludePorts); !v.empty())
    parse_ports(v.c_str(), &c->exclude, "GPUSOCK_EXCLUDE_PORTS");
  // The library reads the rest of rsocket's files itself (wire/config.h).
  c->iomap_size = static_cast<int>(config::get_or(Id::kIomapSize, -1));
  if (c->iomap_size >= 0)
    log::write(log::kInfo, "shim", "iomap_size %d (%s)", c->iomap_size, config::source_text(Id::kIomapSize).c_str());
  parse_preload_config(config::text(Id::kRsocketConfDir), c);
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

}  // namespace gpusock::preload
