// The verbs transport: rdma_cm in the RDMA_PS_TCP port space and RC queue
// pairs, set up exactly as rdma-core's rsocket does (docs/wire-protocol.md §1), so an
// unmodified rsocket peer sees nothing unusual. It executes the core's actions
// and holds no protocol logic. This file: the listener and the domain; the
// endpoint is in verbs_endpoint.cc.
#include "wire/verbs/verbs_transport.h"

#include "wire/config.h"

#include "wire/verbs/verbs_endpoint.h"

#include <cstdlib>
#include <cstring>
#include <string>

namespace gpusock::wire::verbs {
namespace {

const TransportCaps kVerbsCaps = {
    .name = "verbs",
    .device_memory = false,  // dmabuf / peer memory registration comes with the GPU work
    .needs_recv_posts = true,
    .write_with_imm = true,
    .max_private_data = 56,  // IB CM REQ user data after rdma_cm's 36-byte header
    .requests_wait = false,  // rdma_cm's REQ times out unanswered
    .quiet_fd_means_idle = false,
    .registration_pins = true,
};

class VerbsListener final : public Listener {
 public:
  ~VerbsListener() override {
    if (id_) rdma_destroy_id(id_);
    if (channel_) rdma_destroy_event_channel(channel_);
  }
  int open(const sockaddr *addr, int backlog) {
    channel_ = rdma_create_event_channel();
    if (!channel_) return -errno;
    if (int rc = set_nonblocking(channel_->fd); rc < 0) return rc;
    if (rdma_create_id(channel_, &id_, nullptr, RDMA_PS_TCP)) return -errno;
    if (rdma_bind_addr(id_, const_cast<sockaddr *>(addr))) return -errno;
    if (rdma_listen(id_, backlog)) return -errno;
    return 0;
  }
  int get_request(std::unique_ptr<ConnectionRequest> *out) override {
    for (;;) {
      rdma_cm_event *event = nullptr;
      if (rdma_get_cm_event(channel_, &event)) return errno == EAGAIN ? 0 : -errno;
      if (event->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(event);
        continue;
      }
      auto request = std::make_unique<VerbsRequest>(event->id, event->param.conn);
      rdma_ack_cm_event(event);
      *out = std::move(request);
      return 1;
    }
  }
  gs_status_t local_address(sockaddr_storage *out, socklen_t *len) const override {
    copy_addr(rdma_get_local_addr(id_), out, len);
    return 0;
  }
  int wait_fd() const override { return channel_->fd; }
  gs_status_t arm_wait() override { return fd_readable(channel_->fd) ? -EAGAIN : 0; }
  bool maybe_ready() const override { return true; }  // only a system call can look

 private:
  rdma_event_channel *channel_ = nullptr;
  rdma_cm_id *id_ = nullptr;
};

class VerbsDomain final : public Domain {
 public:
  ~VerbsDomain() override {
    if (device_.pd) ibv_dealloc_pd(device_.pd);
    if (device_.context) ibv_close_device(device_.context);
    if (devices_) rdma_free_devices(devices_);
  }

  int open(std::string *error) {
    int n = 0;
    devices_ = rdma_get_devices(&n);
    if (!devices_ || n == 0) {
      *error =
          "gpusock: transport 'verbs' unavailable: no RDMA device (rdma_get_devices found none; "
          "load rdma_rxe and create an rxe device, or choose GPUSOCK_TRANSPORT=fabric:tcp)";
      return -ENODEV;
    }
    const std::string &wanted = config::text(config::Id::kVerbsDevice);
    ibv_device *device = nullptr;
    for (int i = 0; i < n && !device; ++i)
      if (wanted.empty() || wanted == ibv_get_device_name(devices_[i]->device)) device = devices_[i]->device;
    if (!device) {
      *error = "gpusock: GPUSOCK_VERBS_DEVICE=" + wanted + " names no RDMA device";
      return -ENODEV;
    }
    // A device context of our own, not rdma_cm's. rdma_cm opens each device
    // once per program image, so a forked child (a pre-fork worker) would make
    // its queue pairs in its parent's context, and the kernel refuses write()
    // commands on a uverbs file opened by another process (EACCES: rxe rings
    // its send doorbell that way). The queue pairs are ours; rdma_cm only
    // carries the connection (verbs_endpoint.cc).
    ibv_context *&context = device_.context;
    context = ibv_open_device(device);
    if (!context) {
      *error = std::string("gpusock: ibv_open_device(") + ibv_get_device_name(device) + ") failed";
      return errno ? -errno : -ENODEV;
    }
    // iWARP has no write-with-immediate: rsocket's RS_OPT_MSG_SEND variant (§2.11).
    if (context->device->transport_type == IBV_TRANSPORT_IWARP) caps_.write_with_imm = false;
    if (ibv_query_device(context, &device_.attr)) {
      *error = "gpusock: ibv_query_device failed";
      return -errno;
    }
    device_.pd = ibv_alloc_pd(context);
    if (!device_.pd) {
      *error = "gpusock: ibv_alloc_pd failed";
      return -ENOMEM;
    }
    return 0;
  }

  const TransportCaps &caps() const override { return caps_; }
  DeviceMemorySupport device_memory_support(void *, size_t, int) override {
    return {false, "verbs: GPU memory would go through ibv_reg_dmabuf_mr, not wired yet"};
  }
  bool iwarp() const { return !caps_.write_with_imm; }

  gs_status_t register_memory(void *base, size_t length, unsigned access, MemoryRegion *out) override {
    int flags = IBV_ACCESS_LOCAL_WRITE;
    if (access & kAccessRemoteWrite) flags |= IBV_ACCESS_REMOTE_WRITE;
    ibv_mr *mr = ibv_reg_mr(device_.pd, base, length, flags);
    if (!mr) return errno ? -errno : -ENOMEM;
    *out = MemoryRegion{base, length, reinterpret_cast<uintptr_t>(base), mr->rkey, mr, mr};
    return 0;
  }
  void deregister_memory(MemoryRegion *region) override {
    if (region->handle) ibv_dereg_mr(static_cast<ibv_mr *>(region->handle));
    region->handle = nullptr;
  }

  gs_status_t create_endpoint(ConnectionRequest *request, std::unique_ptr<Endpoint> *out) override {
    return create_endpoint(request, EndpointAttr{}, out);
  }
  gs_status_t create_endpoint(ConnectionRequest *request, const EndpointAttr &attr,
                              std::unique_ptr<Endpoint> *out) override {
    return create_verbs_endpoint(&device_, attr, iwarp(), static_cast<VerbsRequest *>(request), out);
  }
  gs_status_t accept(Endpoint *endpoint, ConnectionRequest *request, const void *private_data,
                     uint32_t private_len) override {
    return accept_verbs_endpoint(endpoint, static_cast<VerbsRequest *>(request), private_data, private_len);
  }
  gs_status_t listen(const sockaddr *addr, socklen_t, int backlog, std::unique_ptr<Listener> *out) override {
    auto listener = std::make_unique<VerbsListener>();
    if (int rc = listener->open(addr, backlog); rc < 0) return rc;
    *out = std::move(listener);
    return 0;
  }

 private:
  ibv_context **devices_ = nullptr;
  VerbsDevice device_;
  TransportCaps caps_ = kVerbsCaps;
};

}  // namespace

gs_status_t open_verbs_domain(std::unique_ptr<Domain> *out, std::string *error) {
  auto domain = std::make_unique<VerbsDomain>();
  if (int rc = domain->open(error); rc < 0) return rc;
  *out = std::move(domain);
  return 0;
}

}  // namespace gpusock::wire::verbs
