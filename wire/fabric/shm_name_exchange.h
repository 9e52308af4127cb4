// Name exchanges a listener cannot take (fabric:shm, libfabric 1.17).
//
// A client's first send to an endpoint puts shm's name exchange in that
// endpoint's command queue: the client's region name, in one of the
// endpoint's inject buffers. shm maps that region when it progresses the
// queue, and when it cannot (the client was killed and its files swept, the
// region belongs to a user we may not open, we have no descriptor left) it
// dereferences a null region: the listener's whole process dies in
// fi_cq_read. A listener therefore looks at its queue before each progress
// pass, under the region's lock as shm does, and turns every name exchange
// whose region is gone or not ours to open into a no-op (an operation shm
// discards without a look), returning its inject buffer to the pool: that
// client was gone or refused already. One it cannot open for want of a
// descriptor (EMFILE, ENFILE) stays queued and the pass waits, as the
// kernel keeps a connection in the backlog of a server out of descriptors:
// the client is taken once descriptors are free.
//
// Needs shm's region layout (shm_region.h): a region whose head does not
// check out is left alone.
#pragma once

#include <cstddef>
#include <string>

namespace gpusock::wire::fabric::shm {

class NameExchangeGuard {
 public:
  NameExchangeGuard() = default;
  NameExchangeGuard(const NameExchangeGuard &) = delete;
  NameExchangeGuard &operator=(const NameExchangeGuard &) = delete;
  ~NameExchangeGuard();

  // Our own endpoint's region `name`. False: no guard (another layout).
  bool open(const std::string &name);
  // Before a progress pass of that endpoint (its owner only).
  struct Screened {
    int dropped = 0;    // name exchanges turned into no-ops
    bool held = false;  // one waits for a descriptor: no progress pass now
    int why = 0;        // then -EMFILE or -ENFILE
  };
  Screened screen();

 private:
  void *base_ = nullptr;
  size_t size_ = 0;
  int *lock_ = nullptr;
  size_t cmd_queue_offset_ = 0;
  size_t inject_pool_offset_ = 0;
};

}  // namespace gpusock::wire::fabric::shm
