// Connection endpoints opened ahead of need (fabric:shm).
//
// Opening an shm endpoint is most of what a connection's set-up costs its
// process: libfabric 1.17 creates the endpoint's 16 MiB region in /dev/shm
// and writes zeros over the megabytes past its name (docs/performance.md),
// and a connect waits for both ends to do that, one after the other: the
// listener opens its endpoint only once the client's name exchange came. A
// process that keeps opening endpoints takes them from a small stock that a
// thread of the domain refills, so neither its connects nor its accepts wait
// for a region of their own.
//
// The stock starts at the process's kStartAfter-th endpoint (a client that
// connects once pays for no spare), holds GPUSOCK_SHM_SPARES endpoints, and
// belongs to the process that made it: a forked child takes none of its
// parent's (their regions are the parent's) and opens its own endpoints. A
// spare is an endpoint nobody knows the name of: no peer, nothing queued.
#pragma once

#include "wire/fabric/creator.h"

#include <gpusock/status.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gpusock::wire::fabric::rdm {

struct RdmShared;

class SpareEndpoints {
 public:
  using Open = std::function<gs_status_t(std::shared_ptr<RdmShared> *)>;
  static constexpr uint32_t kStartAfter = 4;

  // `open` opens one endpoint; called on the stock's thread. `stock` 0: none.
  // `ringer`: the domain's, for retiring the spares left at stop().
  SpareEndpoints(Open open, uint32_t stock, int ringer) : open_(std::move(open)), stock_size_(stock), ringer_(ringer) {}
  ~SpareEndpoints() { stop(); }
  SpareEndpoints(const SpareEndpoints &) = delete;
  SpareEndpoints &operator=(const SpareEndpoints &) = delete;

  // A spare endpoint, or null: none ready (the caller opens one itself; the
  // thread is asked for another), or this is not the process that made them.
  std::shared_ptr<RdmShared> take();
  // Stops and joins the thread and closes the stock (before the domain's
  // fabric objects go). Idempotent.
  void stop();

  // What the stock has done, for tests and GPUSOCK_LOG.
  struct Counts {
    uint64_t taken = 0;   // endpoints handed out from the stock
    uint64_t missed = 0;  // asks that found it empty once it had started
    uint64_t opened = 0;  // endpoints the thread opened
    uint64_t failed = 0;  // opens that failed (out of descriptors, memory)
  };
  Counts counts() const;

 private:
  void run();
  bool start_locked();

  const Open open_;
  const uint32_t stock_size_;
  const int ringer_;
  Creator creator_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RdmShared>> stock_;
  std::thread thread_;
  uint32_t asks_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  Counts counts_;
};

}  // namespace gpusock::wire::fabric::rdm
