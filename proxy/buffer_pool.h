// The proxy's buffer sets: a receive ring and a send ring for each connection,
// carved out of two blocks the GPU shares. Shared by the proxy's threads (a
// listener takes sets for the connections it accepts, a closed connection
// gives its set back), so it locks.
#pragma once

#include "proxy/connection.h"

#include <cstdint>
#include <mutex>
#include <vector>

namespace gpusock::proxy {

class BufferPool {
 public:
  // `sets` sets: set i's rings at rbufs + i * rbuf_size and sbufs + i * sbuf_size.
  void reset(uint8_t *rbufs, uint8_t *sbufs, uint32_t sets, uint32_t rbuf_size, uint32_t sbuf_size);
  // A free set into *out; -ENOBUFS when none is left.
  int take(BufferSet *out);
  // A set taken before, once its connection no longer uses its rings.
  void give_back(const BufferSet &set);
  size_t free_sets() const;

 private:
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;
  uint8_t *rbufs_ = nullptr;
  uint8_t *sbufs_ = nullptr;
  uint32_t rbuf_size_ = 0;
  uint32_t sbuf_size_ = 0;
};

}  // namespace gpusock::proxy
