// The shim's configuration (GPUSOCK_* variables and rsocket's files, read once
// per process) and its log (GPUSOCK_LOG). Bottom layer: includes nothing of
// the shim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpusock::preload {

struct Config {
  bool enabled = true;
  bool refuse = false;  // GPUSOCK_FALLBACK=refuse
  int log_level = 0;    // 0 warn, 1 info, 2 debug
  bool have_include = false;
  std::vector<uint64_t> include;  // 65536-bit maps
  std::vector<uint64_t> exclude;
  int iomap_size = -1;  // rsocket iomap_size (applied per socket)
  struct Rule {
    std::string program;                        // prefix, "*" for any
    int domain = -1, type = -1, protocol = -1;  // -1 any
  };
  std::vector<Rule> rules;  // preload_config; empty = intercept everything
};
const Config &config();
void init_config();  // idempotent; the constructor calls it
bool port_selected(uint16_t port);
bool every_port_selected();  // no GPUSOCK_PORTS, no GPUSOCK_EXCLUDE_PORTS
bool rules_select(int domain, int type, int protocol);

void log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace gpusock::preload
