// The side tables of emulated epoll instances. The real epoll fd keeps every
// kernel member; the gpusock members (and the pending sockets, to move them at
// upgrade) live in a side table per epoll instance, shared by its dup'ed fds,
// with their events, data and edge/one-shot state. State only: the emulation
// of epoll_ctl/epoll_wait is in poll_calls.cc.
#pragma once

#include "preload/fd_table.h"

#include <gpusock/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gpusock::preload {

struct EpollEntry {
  int fd;
  uint32_t events;
  epoll_data_t data;
  bool gs;                // false: a pending socket the kernel watches (kept to move it on upgrade)
  bool dormant = false;   // a dormant listener (listeners.h): nobody watches it until it is active
  bool disarmed = false;  // EPOLLONESHOT fired
  uint32_t reported = 0;  // edge-triggered: bits reported and not seen clear since
  uint32_t rgen = 0, wgen = 0;
};

struct EpollSet {
  ~EpollSet();
  std::mutex mu;
  std::vector<EpollEntry> entries;        // change it through the functions below (they keep `ready` and the index)
  gs_ready_set_t *ready = nullptr;        // the armed gpusock members, for the library to say which to look at
  std::unordered_map<int, size_t> index;  // fd -> entries[i], rebuilt when index_dirty
  bool index_dirty = true;
  std::vector<int> numbers;  // fds that refer to this instance
  std::atomic<int> gs_count{0};
  std::atomic<int> dormant_count{0};
  // When a wait last asked the kernel about the kernel members (steady clock,
  // ns): emulated_epoll_wait asks at most every kKernelLookEvery while it
  // has gpusock events to return or spins.
  std::atomic<int64_t> kernel_look_ns{0};
};

// With set.mu held: the entry of fd, or nullptr; adding and removing one.
// A gpusock member that is armed (not a pending socket, dormant or fired
// one-shot) is also in set.ready.
EpollEntry *find_entry(EpollSet &set, int fd);
void add_entry(EpollSet &set, const EpollEntry &entry);
void remove_entry(EpollSet &set, int fd);
// The entry's events changed, or it became a gpusock member, or was disarmed
// or re-armed: set.ready follows.
void update_ready_member(EpollSet &set, const EpollEntry &entry);

std::shared_ptr<EpollSet> find_epoll_set(int epfd);          // nullptr: not emulated
std::shared_ptr<EpollSet> find_or_make_epoll_set(int epfd);  // marks epfd kEpoll

// Bookkeeping the socket and fd calls need.
void epoll_forget_fd(int fd);               // close of a gpusock or pending fd
void epoll_upgrade_fd(int fd);              // a pending or dormant fd became a gpusock socket
bool epoll_has_fd(int fd);                  // is fd a member of an emulated epoll set?
void epoll_forget_epfd(int epfd);           // close of an epoll fd
void epoll_dup_epfd(int oldfd, int newfd);  // dup of an epoll fd
void epoll_after_fork_child();              // gpusock fds became kernel fds (or dormant listeners)

std::mutex &epoll_table_mutex();  // the instances' table (held across fork)

}  // namespace gpusock::preload
