// The fd -> socket map of gpusock's CPU sockets (Socket: StreamSocket). Every
// gs_* call looks its fd up here, from whatever thread makes it, so a lookup
// takes no lock that another socket's lookup touches: each slot has a spin
// lock of its own, on a line of its own, held only to copy the pointer (two
// threads on two sockets never write the same line; a table-wide rwlock made
// every call of every thread write one). Not std::atomic<std::shared_ptr>:
// libstdc++ 12 unlocks its load with a relaxed store, which ThreadSanitizer
// rightly reports against the next writer. Slots come in chunks made on first
// use and kept for the life of the process, so a lookup may race a chunk's
// creation but never its destruction. Writers (add, close, dup) are
// serialized by the engine's table mutex.
#pragma once

#include "wire/socket/spin_pause.h"

#include <errno.h>

#include <atomic>
#include <memory>

namespace gpusock::socket {

template <class Socket>
class FdTable {
 public:
  using SocketPtr = std::shared_ptr<Socket>;
  // fds from 0 to kMaxFds - 1 can hold a socket.
  static constexpr int kChunkBits = 10;
  static constexpr int kMaxChunks = 4096;
  static constexpr int kMaxFds = kMaxChunks << kChunkBits;

  FdTable() = default;
  ~FdTable() {  // the engine's is never destroyed; a test's is
    for (auto &chunk : chunks_) delete[] chunk.load(std::memory_order_relaxed);
  }
  FdTable(const FdTable &) = delete;
  FdTable &operator=(const FdTable &) = delete;

  // The socket on fd, or null.
  SocketPtr get(int fd) const {
    if (fd < 0 || fd >= kMaxFds) return nullptr;
    const Slot *chunk = chunks_[fd >> kChunkBits].load(std::memory_order_acquire);
    return chunk ? chunk[fd & (kChunk - 1)].load() : nullptr;
  }

  // Writers only. Puts `socket` on fd and returns what was there; -EMFILE in
  // *status (and nothing changes) for an fd past kMaxFds.
  SocketPtr put(int fd, SocketPtr socket, int *status) {
    Slot *s = writable_slot(fd);
    *status = s ? 0 : -EMFILE;
    if (!s) return nullptr;
    if (fd > high_water_.load(std::memory_order_relaxed)) high_water_.store(fd, std::memory_order_release);
    return s->exchange(std::move(socket));
  }
  // Writers only. Empties fd's slot; returns what was there.
  SocketPtr take(int fd) {
    if (fd < 0 || fd >= kMaxFds) return nullptr;
    Slot *chunk = chunks_[fd >> kChunkBits].load(std::memory_order_acquire);
    return chunk ? chunk[fd & (kChunk - 1)].exchange(nullptr) : nullptr;
  }

  // f(socket) for every socket in the table (each slot read once; empty
  // slots and fds past the highest ever used cost a load, no write).
  template <class F>
  void for_each(F &&f) const {
    visit([&](Slot &s) {
      if (SocketPtr socket = s.load()) f(std::move(socket));
    });
  }
  // Writers only: empties every slot, handing each socket to f.
  template <class F>
  void take_each(F &&f) {
    visit([&](Slot &s) {
      if (SocketPtr socket = s.exchange(nullptr)) f(std::move(socket));
    });
  }

  // In the child of fork(): forgets every chunk without touching it. A parent
  // thread's lookup in flight at fork may have left a slot's lock bit set in
  // the child's copy; the sockets are abandoned with their chunks (never
  // freed, like everything the child inherits from the parent's transport).
  void abandon() {
    for (auto &chunk : chunks_) chunk.store(nullptr, std::memory_order_relaxed);
    high_water_.store(-1, std::memory_order_relaxed);
  }

 private:
  static constexpr int kChunk = 1 << kChunkBits;

  class alignas(64) Slot {
   public:
    SocketPtr load() const {
      if (!occupied_.load(std::memory_order_acquire)) return nullptr;  // no write for an empty slot
      lock();
      SocketPtr copy = socket_;
      unlock();
      return copy;
    }
    SocketPtr exchange(SocketPtr socket) {  // the old one is dropped by the caller, unlocked
      lock();
      occupied_.store(socket != nullptr, std::memory_order_relaxed);
      socket_.swap(socket);
      unlock();
      return socket;
    }

   private:
    void lock() const {
      for (unsigned step = 0; busy_.exchange(true, std::memory_order_acquire);)
        while (busy_.load(std::memory_order_relaxed)) spin_pause(step++);  // yields to a preempted holder
    }
    void unlock() const { busy_.store(false, std::memory_order_release); }
    mutable std::atomic<bool> busy_{false};
    std::atomic<bool> occupied_{false};  // socket_ != null, readable without the lock
    SocketPtr socket_;
  };

  template <class F>
  void visit(F &&f) const {
    const int top = high_water_.load(std::memory_order_acquire);
    for (int c = 0; c <= (top >> kChunkBits) && top >= 0; ++c)
      if (Slot *chunk = chunks_[c].load(std::memory_order_acquire))
        for (int i = 0; i < kChunk && ((c << kChunkBits) | i) <= top; ++i) f(chunk[i]);
  }

  Slot *writable_slot(int fd) {
    if (fd < 0 || fd >= kMaxFds) return nullptr;
    std::atomic<Slot *> &chunk = chunks_[fd >> kChunkBits];
    Slot *c = chunk.load(std::memory_order_acquire);
    if (!c) {  // writers are serialized: nobody else makes it meanwhile
      c = new Slot[kChunk];
      chunk.store(c, std::memory_order_release);
    }
    return &c[fd & (kChunk - 1)];
  }

  std::atomic<Slot *> chunks_[kMaxChunks] = {};
  std::atomic<int> high_water_{-1};  // the highest fd ever put
};

}  // namespace gpusock::socket
