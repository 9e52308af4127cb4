// Readiness sets: the gpusock sockets one event loop waits on (the shim's
// epoll instances) and which of them a pass looks at, so that a pass costs
// O(sockets with news) rather than O(all sockets), as the kernel's epoll does.
//
// A pass looks at a member when:
//   - its transport hinted it (wire::Domain::take_hints: fabric:shm's peers
//     mark a bit wherever they may have news for it); the hint's owner token
//     names this set and the member's fd, and a pass that takes another set's
//     hints hands them over (every set of the process takes from one board);
//   - it was ready at the last look (level-triggered: looked at until found
//     not ready), or its endpoint cannot promise that only a hint brings news
//     (a listener, a connect under way, a transport without hints, a blocked
//     send, a peer that marks no hints);
//   - it was added or changed since;
//   - a full pass is due: every member every GPUSOCK_READY_SET_FULL_MS
//     (10), for what comes without a hint (a dead peer's verdict, keepalive,
//     the shim's notion of a socket being waited on).
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace gpusock::socket {

class StreamSocket;

class ReadySet {
 public:
  ReadySet();
  ~ReadySet();
  ReadySet(const ReadySet &) = delete;
  ReadySet &operator=(const ReadySet &) = delete;

  // EPOLL_CTL_ADD / MOD / DEL of gpusock socket fd for poll(2) `events`.
  // 0, -EEXIST, -ENOENT, -ENOTSOCK, -EINVAL.
  int ctl(int op, int fd, short events);
  // One pass, no waiting: writes up to `max` ready members (fd, events,
  // revents) and returns how many. `all`: set to whether it looked at every
  // member (a full pass).
  int poll(pollfd *out, int max, bool *all = nullptr);
  // A hint for member fd, from another set's pass.
  void post(int fd);

 private:
  struct Member {
    short events = 0;
    const StreamSocket *socket = nullptr;  // identity: a reused fd is a new member
    bool hinted = false;                   // hints for it come to this set
    bool queued = false;                   // in look_
    uint64_t pass = 0;                     // the last pass that looked at it
  };
  uint64_t token(int fd) const { return (static_cast<uint64_t>(id_) << 32) | static_cast<uint32_t>(fd); }
  void take_hints_locked();
  void queue_locked(int fd);
  // The members look_ names into batch_ (closed ones leave the set), with
  // the quiet wait fds of those without hints found in one poll(2).
  void gather_locked();
  struct Candidate {
    int fd;
    std::shared_ptr<StreamSocket> socket;
    int look_fd;   // StreamSocket::look_fd(), or -1
    int quiet_fd;  // look_fd when found not readable, else -1
  };

  const uint32_t id_;
  std::mutex mu_;
  std::unordered_map<int, Member> members_;
  std::vector<int> look_;  // members the next pass looks at
  std::vector<int> next_;  // scratch: those the pass after it will
  std::vector<int> kept_;  // scratch: looked at, and looked at again next time
  std::vector<uint64_t> owners_;
  std::vector<Candidate> batch_;
  std::vector<pollfd> fd_looks_;
  const std::chrono::milliseconds full_every_;
  std::chrono::steady_clock::time_point next_full_{};
  uint64_t pass_ = 0;
  std::mutex inbox_mu_;
  std::vector<int> inbox_;  // hints handed over by other sets
};

}  // namespace gpusock::socket
