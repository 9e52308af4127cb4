// Whether the transport can register GPU memory (see hmem_probe.cc).
#pragma once

#include <gpusock/proxy.h>

#include <string>

namespace gpusock::proxy {

struct HmemProbe {
  bool transport_can = false;  // the transport registered a GPU buffer in the probe
  std::string reason;          // one phrase for the start-up line
};

// transport: the domain's name ("fabric:tcp", "fabric:shm", "verbs").
HmemProbe probe_device_memory(const std::string &transport, MemoryResource *memory);

}  // namespace gpusock::proxy
