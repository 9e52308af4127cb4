#include "wire/fabric/shm_spares.h"

#include "wire/fabric/fabric_rdm.h"
#include "wire/log.h"

#include <pthread.h>

#include <chrono>
#include <cstdlib>

namespace gpusock::wire::fabric::rdm {

namespace {

// Held by a stock's thread while it opens an endpoint, and across fork():
// a child never starts with libfabric's locks (shm's list of endpoints,
// taken inside fi_enable) held by a thread it does not have, which its own
// first endpoint would wait on for good.
pthread_mutex_t g_open_gate = PTHREAD_MUTEX_INITIALIZER;
std::once_flag g_gate_at_fork;

void lock_gate() { pthread_mutex_lock(&g_open_gate); }
void unlock_gate() { pthread_mutex_unlock(&g_open_gate); }

// Every stock whose thread started, stopped at exit: spare regions are
// nobody's connections, so no close of the application's unlinks them, and
// a process that exits normally leaves nothing in /dev/shm.
std::mutex g_started_mu;
std::vector<SpareEndpoints *> *g_started = new std::vector<SpareEndpoints *>;  // never freed: used at exit

void stop_all_at_exit() {
  std::vector<SpareEndpoints *> started;
  {
    std::lock_guard<std::mutex> lock(g_started_mu);
    started = *g_started;
  }
  for (SpareEndpoints *spares : started) spares->stop();
}

// After a failed open (out of descriptors or memory), the thread waits this
// long before it tries again: the caller opens its own meanwhile.
constexpr std::chrono::milliseconds kRetryAfterFailure{100};

}  // namespace

std::shared_ptr<RdmShared> SpareEndpoints::take() {
  if (stock_size_ == 0 || !creator_.here()) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return nullptr;
  if (!stock_.empty()) {
    auto spare = std::move(stock_.back());
    stock_.pop_back();
    ++counts_.taken;
    cv_.notify_one();
    return spare;
  }
  if (started_) {
    ++counts_.missed;
  } else if (++asks_ >= kStartAfter) {
    started_ = start_locked();
  }
  return nullptr;
}

bool SpareEndpoints::start_locked() {
  std::call_once(g_gate_at_fork, [] {
    pthread_atfork(lock_gate, unlock_gate, unlock_gate);
    std::atexit(stop_all_at_exit);
  });
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    return false;  // no thread: every endpoint is opened when asked for
  }
  {
    std::lock_guard<std::mutex> lock(g_started_mu);
    g_started->push_back(this);
  }
  (void)pthread_setname_np(thread_.native_handle(), "gs-shm-spares");  // for top -H
  return true;
}

void SpareEndpoints::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (stock_.size() >= stock_size_) {
      cv_.wait(lock);
      continue;
    }
    lock.unlock();
    std::shared_ptr<RdmShared> spare;
    lock_gate();
    const gs_status_t rc = open_(&spare);
    unlock_gate();
    lock.lock();
    if (rc == 0 && spare) {
      ++counts_.opened;
      stock_.push_back(std::move(spare));
    } else {
      ++counts_.failed;
      cv_.wait_for(lock, kRetryAfterFailure, [this] { return stopping_; });
    }
  }
}

void SpareEndpoints::stop() {
  if (!creator_.here()) {
    // A forked child: the thread is the parent's, and the stock's regions too
    // (their RdmShared leave them alone here). Never joined, never freed.
    if (thread_.joinable()) new std::thread(std::move(thread_));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(g_started_mu);
    std::erase(*g_started, this);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;  // take() hands out nothing from now on
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<RdmShared>> stock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stock.swap(stock_);  // with the one the thread may have finished while stopping
  }
  for (const auto &spare : stock) retire_shared(spare, ringer_);
  if (started_) {
    log::write(log::kInfo, "fabric", "shm spare endpoints: %llu taken, %llu asks found none, %llu opened, %llu failed",
               static_cast<unsigned long long>(counts_.taken), static_cast<unsigned long long>(counts_.missed),
               static_cast<unsigned long long>(counts_.opened), static_cast<unsigned long long>(counts_.failed));
  }
}

SpareEndpoints::Counts SpareEndpoints::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

}  // namespace gpusock::wire::fabric::rdm
