// gpusock_info: what gpusock can do on this machine, as fi_info and ucx_info
// say it for libfabric and UCX: the version, each transport it can open here
// (and why not the others), the GPUs the CUDA driver sees, and every setting
// with its value and where that came from.
//   gpusock_info [-s | --settings] [-t | --transports] [-g | --gpus]   (all three by default)
#include "wire/config.h"
#include "wire/transport.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

namespace {

using namespace gpusock;

void print_transports() {
  std::printf("transports:\n");
  for (const char *spec : {"verbs", "fabric:tcp", "fabric:shm"}) {
    std::unique_ptr<wire::Domain> domain;
    std::string error;
    const gs_status_t rc = wire::open_domain(spec, &domain, &error);
    if (rc == 0) {
      const wire::TransportCaps &caps = domain->caps();
      std::printf("  %-11s yes  (private data %u B%s%s)\n", spec, caps.max_private_data,
                  caps.device_memory ? ", may register GPU memory" : "",
                  caps.registration_pins ? ", registration pins memory" : "");
    } else {
      std::printf("  %-11s no   %s\n", spec, error.empty() ? gs_status_name(rc) : error.c_str());
    }
  }
  const std::string &chosen = config::text(config::Id::kTransport);
  std::printf("  default: %s\n", chosen.empty() ? "verbs when an RDMA device is present, else fabric:tcp"
                                                : (chosen + " (GPUSOCK_TRANSPORT)").c_str());
}

// The CUDA driver, if the machine has one: loaded here, not linked, so this
// program runs on machines without CUDA.
void print_gpus() {
  std::printf("GPUs:\n");
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) {
    std::printf("  none: no CUDA driver (libcuda.so.1: %s)\n", dlerror());
    return;
  }
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int *);
  using GetFn = int (*)(int *, int);
  using NameFn = int (*)(char *, int, int);
  using VersionFn = int (*)(int *);
  auto init = reinterpret_cast<InitFn>(dlsym(cuda, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(cuda, "cuDeviceGetCount"));
  auto get = reinterpret_cast<GetFn>(dlsym(cuda, "cuDeviceGet"));
  auto name = reinterpret_cast<NameFn>(dlsym(cuda, "cuDeviceGetName"));
  auto version = reinterpret_cast<VersionFn>(dlsym(cuda, "cuDriverGetVersion"));
  int n = 0, v = 0;
  if (!init || !count || !get || !name || init(0) != 0 || count(&n) != 0) {
    std::printf("  none: the CUDA driver did not initialise\n");
  } else {
    if (version && version(&v) == 0) std::printf("  CUDA driver %d.%d\n", v / 1000, v % 1000 / 10);
    for (int i = 0; i < n; ++i) {
      int dev = 0;
      char text[256] = "?";
      if (get(&dev, i) == 0) name(text, sizeof text, dev);
      std::printf("  %d: %s\n", i, text);
    }
    if (n == 0) std::printf("  none\n");
  }
  dlclose(cuda);
}

void print_settings() {
  std::printf("settings (an explicit API option > the environment > rsocket's file > the default):\n");
  for (int i = 0; i < static_cast<int>(config::Id::kCount); ++i) {
    const auto id = static_cast<config::Id>(i);
    const config::Setting &s = config::describe(id);
    std::printf("  %-31s %-18s %-8s %s\n", s.name, config::value_text(id).c_str(), s.component, s.doc);
    if (config::source(id) != config::Source::kDefault)
      std::printf("  %-31s   from %s\n", "", config::source_text(id).c_str());
  }
}

}  // namespace

int main(int argc, char **argv) {
  bool settings = false, transports = false, gpus = false;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i];
    if (!std::strcmp(a, "-s") || !std::strcmp(a, "--settings")) settings = true;
    else if (!std::strcmp(a, "-t") || !std::strcmp(a, "--transports")) transports = true;
    else if (!std::strcmp(a, "-g") || !std::strcmp(a, "--gpus")) gpus = true;
    else {
      std::fprintf(stderr, "usage: %s [-s|--settings] [-t|--transports] [-g|--gpus]\n", argv[0]);
      return 2;
    }
  }
  if (!settings && !transports && !gpus) settings = transports = gpus = true;
  std::printf("gpusock %s\n", GPUSOCK_VERSION);
  if (transports) print_transports();
  if (gpus) print_gpus();
  if (settings) print_settings();
  return 0;
}
