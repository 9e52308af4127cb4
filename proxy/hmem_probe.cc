// Can the transport register GPU memory? Asked once at proxy start, so the
// start-up line says why the socket rings live where they do.
//
// libfabric: fi_getinfo for the provider with FI_HMEM and FI_MR_HMEM, then a
// real registration of a small GPU buffer with iface FI_HMEM_CUDA on a domain
// opened from that entry. A libfabric built without CUDA (Debian's 1.17) lists
// FI_HMEM for shm (system memory only) but fails the registration, which is
// the answer that counts. verbs: dmabuf registration (ibv_reg_dmabuf_mr) needs
// an RDMA device and the CUDA driver's dmabuf export; it is not wired yet.
#include "proxy/hmem_probe.h"

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <string>

namespace gpusock::proxy {

namespace {

struct InfoDeleter {
  void operator()(fi_info *i) const { fi_freeinfo(i); }
};

std::string fabric_probe(const char *prov, MemoryResource *memory) {
  fi_info *hints = fi_allocinfo();
  if (!hints) return "probe: out of memory";
  hints->caps = FI_MSG | FI_RMA | FI_HMEM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  hints->fabric_attr->prov_name = strdup(prov);
  fi_info *list = nullptr;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints, &list);
  fi_freeinfo(hints);
  if (ret != 0 || !list) return std::string("libfabric provider ") + prov + " offers no FI_HMEM";
  std::unique_ptr<fi_info, InfoDeleter> all(list);
  const fi_info *info = nullptr;
  for (const fi_info *cur = list; cur; cur = cur->next)
    if (cur->caps & FI_HMEM) {
      info = cur;
      break;
    }
  if (!info) return std::string("libfabric provider ") + prov + " offers no FI_HMEM";
  fid_fabric *fabric = nullptr;
  fid_domain *domain = nullptr;
  std::string verdict;
  ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (ret == 0) ret = fi_domain(fabric, const_cast<fi_info *>(info), &domain, nullptr);
  MemoryBlock block{};
  if (ret != 0) {
    verdict = std::string("FI_HMEM domain of ") + prov + ": " + fi_strerror(-ret);
  } else if (memory->allocate(MemoryKind::kDevice, 1u << 16, &block) < 0) {
    verdict = "no GPU buffer to try";
  } else {
    iovec iov{block.device, block.size};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = 0;
    fid_mr *mr = nullptr;
    ret = fi_mr_regattr(domain, &attr, 0, &mr);
    if (ret == 0) {
      verdict = std::string("libfabric ") + prov + " registers CUDA memory (FI_HMEM_CUDA)";
      fi_close(&mr->fid);
    } else {
      verdict = std::string("libfabric ") + prov + " cannot register CUDA memory (fi_mr_regattr FI_HMEM_CUDA: " +
                fi_strerror(-ret) + "; libfabric " + std::to_string(FI_MAJOR(fi_version())) + "." +
                std::to_string(FI_MINOR(fi_version())) + " built without CUDA)";
    }
    memory->release(&block);
  }
  if (domain) fi_close(&domain->fid);
  if (fabric) fi_close(&fabric->fid);
  return verdict;
}

}  // namespace

HmemProbe probe_device_memory(const std::string &transport, MemoryResource *memory) {
  HmemProbe p;
  if (!memory || !memory->has_device_memory()) {
    p.reason = "host backend, no GPU memory";
    return p;
  }
  if (transport.rfind("fabric:", 0) == 0) {
    p.reason = fabric_probe(transport.c_str() + 7, memory);
    p.transport_can = p.reason.find("registers CUDA memory") != std::string::npos;
    return p;
  }
  if (transport == "verbs") {
    p.reason = "verbs: GPU memory would go through ibv_reg_dmabuf_mr, not wired yet";
    return p;
  }
  p.reason = transport + ": no GPU memory registration";
  return p;
}

}  // namespace gpusock::proxy
