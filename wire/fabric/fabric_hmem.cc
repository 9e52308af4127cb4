// Can a libfabric provider register GPU memory? Asked once by a GPU proxy at
// start, so its start-up line says why the socket rings live where they do.
//
// fi_getinfo for the provider with FI_HMEM and FI_MR_HMEM, then a real
// registration of the caller's GPU buffer with iface FI_HMEM_CUDA on a fabric
// and domain opened from that entry (the transport's own domain is opened
// without FI_HMEM: asking for it costs shm its inject path). A libfabric built
// without CUDA (Debian's 1.17) lists FI_HMEM for shm (system memory only) but
// fails the registration, which is the answer that counts.
#include "wire/fabric/fabric_common.h"

#include <cstring>
#include <string>

namespace gpusock::wire::fabric {

DeviceMemorySupport FabricDomainBase::device_memory_support(void *gpu_buffer, size_t length, int cuda_device) {
  const std::string prov = attr_.prov_name;
  const std::string none = "libfabric provider " + prov + " offers no FI_HMEM";
  if (!attr_.device_memory) return {false, none};
  InfoPtr hints(fi_allocinfo());
  if (!hints) return {false, "probe: out of memory"};
  hints->caps = FI_MSG | FI_RMA | FI_HMEM;
  hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
  hints->fabric_attr->prov_name = strdup(attr_.prov_name);
  fi_info *list = nullptr;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints.get(), &list);
  if (ret != 0 || !list) return {false, none};
  InfoPtr all(list);
  const fi_info *info = nullptr;
  for (const fi_info *cur = list; cur && !info; cur = cur->next)
    if (cur->caps & FI_HMEM) info = cur;
  if (!info) return {false, none};
  if (!gpu_buffer) return {false, "no GPU buffer to try"};
  fid_fabric *fabric = nullptr;
  fid_domain *domain = nullptr;
  DeviceMemorySupport answer;
  ret = fi_fabric(info->fabric_attr, &fabric, nullptr);
  if (ret == 0) ret = fi_domain(fabric, const_cast<fi_info *>(info), &domain, nullptr);
  if (ret != 0) {
    answer.why = "FI_HMEM domain of " + prov + ": " + fi_error_text(ret);
  } else {
    iovec iov{gpu_buffer, length};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = cuda_device;
    fid_mr *mr = nullptr;
    ret = fi_mr_regattr(domain, &attr, 0, &mr);
    if (ret == 0) {
      answer = {true, "libfabric " + prov + " registers CUDA memory (FI_HMEM_CUDA)"};
      close_fid(mr);
    } else {
      answer.why = "libfabric " + prov +
                   " cannot register CUDA memory (fi_mr_regattr FI_HMEM_CUDA: " + fi_error_text(ret) + "; libfabric " +
                   std::to_string(FI_MAJOR(fi_version())) + "." + std::to_string(FI_MINOR(fi_version())) +
                   " built without CUDA)";
    }
  }
  close_fid(domain);
  close_fid(fabric);
  return answer;
}

}  // namespace gpusock::wire::fabric
