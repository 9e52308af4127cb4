#include "wire/fabric/fabric_common.h"
#include "wire/config.h"
#include "wire/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include <unistd.h>

namespace gpusock::wire::fabric {

int fi_status(int64_t fi_ret) {
  if (fi_ret >= 0) return static_cast<int>(fi_ret);
  const int64_t code = -fi_ret;
  if (code < FI_ERRNO_OFFSET) return static_cast<int>(-code);  // FI_E* below 256 are errno values
  switch (code) {
    case FI_ETOOSMALL:
      return -ENOBUFS;
    case FI_EOPBADSTATE:
      return -ENOTCONN;
    case FI_EBADFLAGS:
      return -EINVAL;
    case FI_ENOEQ:
    case FI_EDOMAIN:
    case FI_ENOCQ:
    case FI_ENOAV:
      return -EINVAL;
    case FI_ETRUNC:
      return -EMSGSIZE;
    case FI_ENOKEY:
      return -EKEYREJECTED;
    case FI_EOVERRUN:
      return -EOVERFLOW;
    case FI_ENORX:
      return -ENOBUFS;
    case FI_EAVAIL:
    case FI_ECRC:
    case FI_EOTHER:
    default:
      return -EIO;
  }
}

std::string fi_error_text(int64_t fi_ret) {
  const int code = static_cast<int>(fi_ret < 0 ? -fi_ret : fi_ret);
  return fi_strerror(code);
}

gs_status_t TxRing::init(size_t capacity) {
  size_t size = 1;
  while (size < capacity) size <<= 1;
  slots_.reset(new (std::nothrow) Slot[size]);
  if (!slots_) return -ENOMEM;
  mask_ = size - 1;
  head_ = tail_ = 0;
  return 0;
}

void TxRing::fail_all(int status) {
  for (uint64_t i = head_; i != tail_; ++i) {
    Slot &slot = slots_[i & mask_];
    if (!slot.done) {
      slot.status = status;
      slot.done = true;
    }
  }
}

gs_status_t FabricEndpointBase::init_base(const FabricDomainBase &domain) {
  length_in_data_ = domain.length_in_cq_data();
  inject_size_ = domain.inject_size();
  inbound_capacity_ = domain.inbound_capacity();
  delivery_acks_ = domain.attr().closing_write_acked;
  return ring_.init(domain.info()->tx_attr->size);
}

gs_status_t FabricDomainBase::open_endpoint_cq(fid_cq **out, fi_wait_obj wait_obj, const fi_info *info,
                                               uint32_t endpoints) const {
  if (info == nullptr) info = info_.get();
  fi_cq_attr cq_attr{};
  cq_attr.size = (info->tx_attr->size + info->rx_attr->size) * endpoints;
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.wait_obj = wait_obj;
  return fi_status(fi_cq_open(domain_, &cq_attr, out, nullptr));
}

gs_status_t FabricEndpointBase::post_write_to(fid_ep *ep, fi_addr_t dest, const WriteRequest &request) {
  if (state_ != State::kEstablished) [[unlikely]] {
    return state_ == State::kClosed ? -ECONNRESET : -ENOTCONN;
  }
  if (ring_.full()) [[unlikely]]
    return -EAGAIN;
  if (request.closes && delivery_acks_) return post_delivered_write(ep, dest, request);
  ssize_t ret;
  if (request.inline_data && request.length <= inject_size_) {
    if (request.has_imm) {
      ret = fi_inject_writedata(ep, request.local, request.length,
                                make_cq_data(request.imm, request.length, peer_cq_tag_), dest, request.remote_addr,
                                request.rkey);
    } else {
      ret = fi_inject_write(ep, request.local, request.length, dest, request.remote_addr, request.rkey);
    }
    if (ret != 0) [[unlikely]]
      return fi_status(ret);
    ring_.push_done(request.token);
    return 0;
  }
  TxRing::Slot *slot = ring_.push(request.token);
  void *desc = request.region != nullptr ? request.region->desc : nullptr;
  if (request.has_imm) {
    ret = fi_writedata(ep, request.local, request.length, desc, make_cq_data(request.imm, request.length, peer_cq_tag_),
                       dest, request.remote_addr, request.rkey, slot);
  } else {
    ret = fi_write(ep, request.local, request.length, desc, dest, request.remote_addr, request.rkey, slot);
  }
  if (ret != 0) [[unlikely]] {
    ring_.unpush();
    return fi_status(ret);
  }
  return 0;
}

// FI_DELIVERY_COMPLETE: the provider completes the write once the peer's
// provider acknowledged it. On a byte stream that acknowledgement covers every
// write before it too, so tearing the endpoint down afterwards (which resets
// the socket if the peer's credit updates sit unread in it, discarding what
// the kernel had not sent yet) loses nothing.
gs_status_t FabricEndpointBase::post_delivered_write(fid_ep *ep, fi_addr_t dest, const WriteRequest &request) {
  TxRing::Slot *slot = ring_.push(request.token);
  iovec iov{const_cast<void *>(request.local), request.length};
  void *desc = request.region != nullptr ? request.region->desc : nullptr;
  fi_rma_iov rma{request.remote_addr, request.length, request.rkey};
  fi_msg_rma msg{};
  msg.msg_iov = &iov;
  msg.desc = &desc;
  msg.iov_count = 1;
  msg.addr = dest;
  msg.rma_iov = &rma;
  msg.rma_iov_count = 1;
  msg.context = slot;
  msg.data = request.has_imm ? make_cq_data(request.imm, request.length, peer_cq_tag_) : 0;
  const uint64_t flags = FI_DELIVERY_COMPLETE | FI_COMPLETION | (request.has_imm ? FI_REMOTE_CQ_DATA : 0);
  const ssize_t ret = fi_writemsg(ep, &msg, flags);
  if (ret != 0) [[unlikely]] {
    ring_.unpush();
    return fi_status(ret);
  }
  return 0;
}

FabricDomainBase::~FabricDomainBase() {
  close_fid(domain_);
  close_fid(fabric_);
}

gs_status_t FabricDomainBase::open_base(std::string *error) {
  InfoPtr hints(fi_allocinfo());
  if (!hints) return -ENOMEM;
  // Device memory (FI_HMEM) costs shm its inject path (inject_size 0), and the
  // Debian build of libfabric 1.17 has no CUDA support, so it is opt-in.
  const bool want_hmem = attr_.device_memory && config::get(config::Id::kFabricHmem) != 0;
  hints->ep_attr->type = attr_.ep_type;
  hints->caps = FI_MSG | FI_RMA | FI_WRITE | FI_REMOTE_WRITE | (want_hmem ? FI_HMEM : 0);
  hints->mode = attr_.mode;
  hints->domain_attr->mr_mode = static_cast<int>(attr_.mr_mode | (want_hmem ? FI_MR_HMEM : 0));
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(attr_.prov_name);
  if (attr_.queue_entries != config::Id::kCount) {
    const auto entries = static_cast<size_t>(config::get(attr_.queue_entries));
    hints->tx_attr->size = entries;
    hints->rx_attr->size = entries;
  }

  fi_info *list = nullptr;
  int ret = fi_getinfo(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION), nullptr, nullptr, 0, hints.get(), &list);
  if (ret != 0) {
    if (error != nullptr) {
      *error = std::string("gpusock: libfabric provider '") + attr_.prov_name +
               "' not available (fi_getinfo: " + fi_error_text(ret) + ")";
    }
    return ret == -FI_ENODATA ? -ENOENT : fi_status(ret);
  }
  InfoPtr all(list);
  // Prefer an entry that keeps the inject path (shm lists an FI_HMEM variant
  // with inject_size 0 even when FI_HMEM was not asked for).
  const fi_info *chosen = nullptr;
  for (const fi_info *cur = list; cur != nullptr; cur = cur->next) {
    const bool hmem = (cur->caps & FI_HMEM) != 0;
    if (hmem != want_hmem) continue;
    if (chosen == nullptr || (chosen->tx_attr->inject_size == 0 && cur->tx_attr->inject_size > 0)) chosen = cur;
  }
  if (chosen == nullptr) chosen = list;
  if (chosen->domain_attr->cq_data_size < 4) {
    if (error != nullptr) {
      *error = std::string("gpusock: libfabric provider '") + attr_.prov_name +
               "' cannot carry a 32-bit immediate (cq_data_size " + std::to_string(chosen->domain_attr->cq_data_size) +
               ")";
    }
    return -ENOTSUP;
  }
  if ((chosen->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
    if (error != nullptr) *error = "gpusock: provider needs FI_MR_ENDPOINT, which gpusock does not offer";
    return -ENOTSUP;
  }
  info_.reset(fi_dupinfo(chosen));
  if (!info_) return -ENOMEM;

  ret = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (ret != 0) {
    if (error != nullptr) *error = std::string("gpusock: fi_fabric(") + attr_.prov_name + "): " + fi_error_text(ret);
    return fi_status(ret);
  }
  ret = fi_domain(fabric_, info_.get(), &domain_, nullptr);
  if (ret != 0) {
    if (error != nullptr) *error = std::string("gpusock: fi_domain(") + attr_.prov_name + "): " + fi_error_text(ret);
    return fi_status(ret);
  }

  rx_cq_data_ = (info_->mode & FI_RX_CQ_DATA) != 0;
  length_in_cq_data_ = info_->domain_attr->cq_data_size >= 8;
  inject_size_ = static_cast<uint32_t>(std::min<size_t>(info_->tx_attr->inject_size, UINT32_MAX));
  if (attr_.queue_entries != config::Id::kCount) {
    inbound_capacity_ = static_cast<uint32_t>(std::min<size_t>(info_->rx_attr->size, UINT32_MAX));
  }
  caps_.name = attr_.spec;
  caps_.device_memory = want_hmem && (info_->caps & FI_HMEM) != 0;
  caps_.needs_recv_posts = rx_cq_data_ || attr_.imm_consumes_recv;
  caps_.write_with_imm = true;
  // FI_EP_MSG: the CQ's wait fd is an epoll set over the connection's socket.
  caps_.quiet_fd_means_idle = attr_.ep_type == FI_EP_MSG;
  caps_.max_private_data = std::min<uint32_t>(attr_.max_private_data, sizeof(CmEvent{}.peer_private_data));
  return 0;
}

namespace {

// 32 unpredictable bits (getrandom; a seeded generator of this thread's
// where the kernel says no).
uint32_t random_key() {
  uint32_t key = 0;
  if (getrandom(&key, sizeof key, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof key)) return key;
  thread_local std::mt19937 fallback{std::random_device{}()};
  return static_cast<uint32_t>(fallback());
}

}  // namespace

gs_status_t FabricDomainBase::register_memory(void *base, size_t length, unsigned access, MemoryRegion *out) {
  if (out == nullptr || (base == nullptr && length != 0)) return -EINVAL;
  uint64_t fi_access = FI_READ | FI_WRITE | FI_SEND | FI_RECV;
  if ((access & kAccessRemoteWrite) != 0) fi_access |= FI_REMOTE_WRITE | FI_REMOTE_READ;
  const uint64_t mr_mode = static_cast<uint64_t>(info_->domain_attr->mr_mode);

  fid_mr *mr = nullptr;
  int ret = -FI_ENOKEY;
  // Keys are ours, 32 bits (what the rsocket record carries), and random: the
  // providers check a remote write's key against every registration of the
  // domain, not the connection's, so a peer must not be able to guess the
  // keys of other connections' rings. A key in use is drawn again.
  for (int attempt = 0; attempt < 16 && ret == -FI_ENOKEY; ++attempt) {
    uint32_t key = 0;
    while (key == 0) key = random_key();
    ret = fi_mr_reg(domain_, base, length, fi_access, 0, key, 0, &mr, nullptr);
  }
  if (ret != 0) return fi_status(ret);

  const uint64_t key = fi_mr_key(mr);
  if (key == FI_KEY_NOTAVAIL || key > UINT32_MAX) {
    // A provider key that does not fit the record's 32 bits (FI_MR_PROV_KEY).
    fi_close(&mr->fid);
    return -EOVERFLOW;
  }
  out->base = base;
  out->length = length;
  out->remote_addr = (mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uintptr_t>(base) : 0;
  out->rkey = static_cast<uint32_t>(key);
  out->desc = fi_mr_desc(mr);
  out->handle = mr;
  return 0;
}

void FabricDomainBase::deregister_memory(MemoryRegion *region) {
  if (region == nullptr || region->handle == nullptr) return;
  fi_close(&static_cast<fid_mr *>(region->handle)->fid);
  region->handle = nullptr;
  region->desc = nullptr;
}

namespace {

thread_local std::string t_error_detail;

}  // namespace

void set_error_detail(std::string text) {
  // Said once, not at every retry (a forked worker that tries a busy port).
  thread_local std::string logged;
  t_error_detail = std::move(text);
  if (!t_error_detail.empty() && t_error_detail != logged && log::enabled(log::kInfo)) {
    logged = t_error_detail;
    log::write(log::kInfo, "fabric", "%s", t_error_detail.c_str());
  }
}

const std::string &error_detail() { return t_error_detail; }

socklen_t sockaddr_len(const sockaddr *addr) {
  if (addr == nullptr) return 0;
  switch (addr->sa_family) {
    case AF_INET:
      return sizeof(sockaddr_in);
    case AF_INET6:
      return sizeof(sockaddr_in6);
    default:
      return 0;
  }
}

bool copy_sockaddr(const sockaddr *addr, socklen_t len, sockaddr_storage *out) {
  const socklen_t need = sockaddr_len(addr);
  if (need == 0 || len < need) return false;
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, addr, need);
  return true;
}

gs_status_t output_sockaddr(const sockaddr_storage &addr, sockaddr_storage *out, socklen_t *len) {
  const socklen_t need = sockaddr_len(reinterpret_cast<const sockaddr *>(&addr));
  if (need == 0) return -ENOTCONN;
  if (out != nullptr) std::memcpy(out, &addr, need);
  if (len != nullptr) *len = need;
  return 0;
}

gs_status_t open_fabric_domain(std::string_view spec, std::unique_ptr<Domain> *out, std::string *error) {
  const ProviderAttr *attr = find_provider_attr(spec);
  if (attr == nullptr) {
    if (error != nullptr) *error = "gpusock: unknown libfabric transport '" + std::string(spec) + "'";
    return -EINVAL;
  }
  switch (attr->ep_type) {
    case FI_EP_MSG:
      return open_msg_domain(*attr, out, error);
    case FI_EP_RDM:
      return open_rdm_domain(*attr, out, error);
    default:
      if (error != nullptr) *error = "gpusock: unsupported endpoint type for " + std::string(spec);
      return -ENOTSUP;
  }
}

}  // namespace gpusock::wire::fabric
