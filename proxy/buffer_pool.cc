#include "proxy/buffer_pool.h"

#include <cerrno>

namespace gpusock::proxy {

void BufferPool::reset(uint8_t *rbufs, uint8_t *sbufs, uint32_t sets, uint32_t rbuf_size, uint32_t sbuf_size) {
  std::lock_guard lock(mu_);
  rbufs_ = rbufs;
  sbufs_ = sbufs;
  rbuf_size_ = rbuf_size;
  sbuf_size_ = sbuf_size;
  free_.clear();
  free_.reserve(sets);
  for (uint32_t i = sets; i-- > 0;) free_.push_back(i);  // set 0 is taken first
}

int BufferPool::take(BufferSet *out) {
  uint32_t i;
  {
    std::lock_guard lock(mu_);
    if (free_.empty()) return -ENOBUFS;
    i = free_.back();
    free_.pop_back();
  }
  out->index = i;
  out->rbuf = rbufs_ + size_t(i) * rbuf_size_;
  out->sbuf = sbufs_ + size_t(i) * sbuf_size_;
  out->rbuf_size = rbuf_size_;
  out->sbuf_size = sbuf_size_;
  return 0;
}

void BufferPool::give_back(const BufferSet &set) {
  std::lock_guard lock(mu_);
  free_.push_back(set.index);
}

size_t BufferPool::free_sets() const {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace gpusock::proxy
