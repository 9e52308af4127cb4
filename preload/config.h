// The shim's configuration (its GPUSOCK_* settings and rsocket's
// preload_config, read once per process). Bottom layer: includes nothing of
// the shim; it logs through gpusock's logger (wire/log.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpusock::preload {

struct Config {
  bool enabled = true;
  bool refuse = false;  // GPUSOCK_FALLBACK=refuse
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

}  // namespace gpusock::preload
