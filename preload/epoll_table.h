// The side tables of emulated epoll instances. The real epoll fd keeps every
// kernel member; the gpusock members (and the pending sockets, to move them at
// upgrade) live in a side table per epoll instance, shared by its dup'ed fds,
// with their events, data and edge/one-shot state. State only: the emulation
// of epoll_ctl/epoll_wait is in poll_calls.cc.
#pragma once

#include "preload/fd_table.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
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
  std::mutex mu;
  std::vector<EpollEntry> entries;
  std::vector<int> numbers;  // fds that refer to this instance
  std::atomic<int> gs_count{0};
  std::atomic<int> dormant_count{0};
  size_t next = 0;  // round-robin start among gpusock entries
};

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
