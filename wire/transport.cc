// Transport factory: maps a spec to the transport that implements it. It knows
// transports (and what each needs from the machine), nothing of sockets.
#include "wire/transport.h"

#include "wire/config.h"

#include "wire/fabric/fabric_domain.h"
#if GPUSOCK_HAVE_VERBS
#include "wire/verbs/verbs_transport.h"
#endif

#include <dirent.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace gpusock::wire {
namespace {

constexpr const char *kValidSpecs = "verbs, fabric:tcp, fabric:shm";

// Is a verbs transport compiled into this build? (wire/verbs, when librdmacm
// and libibverbs were found; wire/fabric/CMakeLists.txt defines the macro.)
#if GPUSOCK_HAVE_VERBS
constexpr bool kVerbsBuilt = true;
#else
constexpr bool kVerbsBuilt = false;
#endif

bool rdma_device_present() {
  DIR *dir = opendir("/sys/class/infiniband");
  if (dir == nullptr) return false;
  bool found = false;
  while (dirent *entry = readdir(dir)) {
    if (entry->d_name[0] != '.') {
      found = true;
      break;
    }
  }
  closedir(dir);
  return found;
}

gs_status_t open_verbs([[maybe_unused]] std::unique_ptr<Domain> *out, std::string *error) {
  if (!rdma_device_present()) {
    if (error != nullptr) *error = "gpusock: transport 'verbs' unavailable: no RDMA device under /sys/class/infiniband";
    return -ENODEV;
  }
#if GPUSOCK_HAVE_VERBS
  return verbs::open_verbs_domain(out, error);
#else
  if (error != nullptr) *error = "gpusock: transport 'verbs' unavailable: verbs transport not built";
  return -ENODEV;
#endif
}

}  // namespace

gs_status_t open_domain(const std::string &spec_in, std::unique_ptr<Domain> *out, std::string *error) {
  if (out == nullptr) return -EINVAL;
  std::string spec = spec_in;
  if (spec.empty()) {
    const std::string &chosen = config::text(config::Id::kTransport);
    if (!chosen.empty()) {
      spec = chosen;
    } else {
      spec = (kVerbsBuilt && rdma_device_present()) ? "verbs" : "fabric:tcp";
    }
  }
  if (spec == "verbs") return open_verbs(out, error);
  if (fabric::is_fabric_spec(spec)) return fabric::open_fabric_domain(spec, out, error);
  if (error != nullptr) *error = "gpusock: unknown transport '" + spec + "' (valid: " + kValidSpecs + ")";
  return -EINVAL;
}

}  // namespace gpusock::wire
