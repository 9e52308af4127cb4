// Inside the verbs transport: what its endpoint (verbs_endpoint.cc) and the
// rest (verbs_transport.cc: requests, listener, domain) share.
#pragma once

#include "wire/transport.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace gpusock::wire::verbs {

// What an endpoint needs of its domain's device.
struct VerbsDevice {
  ibv_context *context = nullptr;
  ibv_pd *pd = nullptr;
  ibv_device_attr attr{};
};

inline int set_nonblocking(int fd) {
  const int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -errno : (fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 ? -errno : 0);
}

// Readable now? (A look at a level-triggered fd; no wait.)
inline bool fd_readable(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  return ::poll(&pfd, 1, 0) > 0;
}

inline socklen_t sockaddr_len(const sockaddr *sa) {
  return sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

inline void copy_addr(const sockaddr *sa, sockaddr_storage *out, socklen_t *len) {
  const socklen_t n = sockaddr_len(sa);
  std::memcpy(out, sa, n);
  *len = n;
}

class VerbsRequest final : public ConnectionRequest {
 public:
  VerbsRequest(rdma_cm_id *id, const rdma_conn_param &param) : id_(id), param_(param) {
    len_ = std::min<uint32_t>(param.private_data_len, sizeof data_);
    if (param.private_data) std::memcpy(data_, param.private_data, len_);
    param_.private_data = nullptr;
    param_.private_data_len = 0;
  }
  ~VerbsRequest() override {
    if (id_) {
      rdma_reject(id_, nullptr, 0);
      rdma_destroy_id(id_);
    }
  }
  const uint8_t *private_data() const override { return data_; }
  uint32_t private_len() const override { return len_; }
  void reject() override {
    if (!id_) return;
    rdma_reject(id_, nullptr, 0);  // §1.5: a bad record is rejected with no data
    rdma_destroy_id(id_);
    id_ = nullptr;
  }
  rdma_cm_id *take_id() {
    rdma_cm_id *id = id_;
    id_ = nullptr;
    return id;
  }
  const rdma_conn_param &param() const { return param_; }

 private:
  rdma_cm_id *id_;
  rdma_conn_param param_;
  uint8_t data_[256] = {};
  uint32_t len_ = 0;
};

// An endpoint for connect() (request == nullptr), or one that will accept
// `request`: its QP and receives exist before the reply.
gs_status_t create_verbs_endpoint(const VerbsDevice *device, const EndpointAttr &attr, bool iwarp,
                                  VerbsRequest *request, std::unique_ptr<Endpoint> *out);
// Domain::accept: answer `request` on `endpoint` (made for it) with our record.
gs_status_t accept_verbs_endpoint(Endpoint *endpoint, VerbsRequest *request, const void *private_data,
                                  uint32_t private_len);

}  // namespace gpusock::wire::verbs
