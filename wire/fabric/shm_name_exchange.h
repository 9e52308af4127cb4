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
// A connecting client's endpoint gets one name exchange, from the listener's
// new endpoint ahead of its ACCEPT. It screens too, while it connects, and
// drops an exchange it cannot open for want of a descriptor as well: that
// connect fails with EMFILE (or ENFILE) instead of the process crashing.
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

  // Our own endpoint's region `name`. False: no guard (errno set by the open,
  // or 0 for another layout).
  bool open(const std::string &name);
  bool is_open() const { return base_ != nullptr; }
  void close();
  // What to do with a name exchange that cannot be opened for want of a
  // descriptor: keep it queued (a listener) or drop it too (a client).
  enum class Short : bool { kHold, kDrop };
  // Before a progress pass of that endpoint (its owner only).
  struct Screened {
    int dropped = 0;  // name exchanges turned into no-ops
    // One could not be opened for want of a descriptor: held, it waits, and
    // no progress pass may run now; dropped, the endpoint's connect fails.
    bool out_of_descriptors = false;
    int why = 0;  // then -EMFILE or -ENFILE
  };
  Screened screen(Short when_short = Short::kHold);

 private:
  void *base_ = nullptr;
  size_t size_ = 0;
  int *lock_ = nullptr;
  size_t cmd_queue_offset_ = 0;
  size_t inject_pool_offset_ = 0;
};

}  // namespace gpusock::wire::fabric::shm
