// Readiness sets: the gpusock sockets one event loop waits on (the shim's
// epoll instances) and which of them a pass looks at, so that a pass costs
// O(sockets with news) rather than O(all sockets), as the kernel's epoll does.
//
// A pass looks at a member when:
//   - its transport hinted it (wire::Domain::take_hints: fabric:shm's peers
//     mark a bit of the member's slot wherever they may have news for it);
//     a set takes only the bits of its own members' slots, so sets of one
//     process never take each other's news;
//   - it was ready at the last look (level-triggered: looked at until found
//     not ready), or its endpoint cannot promise that only a hint brings news
//     (a listener, a connect under way, a transport without hints, a blocked
//     send, work taken and not yet consumed, a member of another set too:
//     that set may take its hints);
//   - it was added or changed since;
//   - a full pass is due: every member every GPUSOCK_READY_SET_FULL_MS
//     (10), for what comes without a hint (a dead peer's verdict, keepalive,
//     the shim's notion of a socket being waited on).
//
// A sleep arms the set's sleep group (wire::SleepGroup) once for every
// member whose hints wake that group and that was found quiet, and arms the
// others one by one (their transport has no hints, another set watches
// them too, or they had news at the last look): a sleep over idle fabric:shm
// connections costs the same with ten members or ten thousand.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gpusock::wire {
class Domain;
class SleepGroup;
}  // namespace gpusock::wire

namespace gpusock::socket {

class StreamSocket;

// A socket a thread is about to sleep on (gs_wait_begin): known_quiet when a
// readiness set found it not ready and quiet, with no hint since.
struct SleepMember {
  std::shared_ptr<StreamSocket> socket;
  short events;
  bool known_quiet;
};

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

  // Begins the calling thread's sleep: the members to arm one by one into
  // *out, and the fd of the group that stands for the rest (-1: none).
  // False, and none, when hints came for members since the last pass (look
  // again instead). Call end_sleep() after a true, when the sleep is over or
  // was not taken: it gives back the sockets of *out (to unregister them),
  // and says whether the thread was asleep here. `slept`: the sleep's wait
  // fds as poll(2) left them, if known: the group's wake-ups are read only
  // when they say it was rung (or a waker took its word).
  bool begin_sleep(std::vector<SleepMember> *out, int *group_fd);
  bool end_sleep(std::vector<std::shared_ptr<StreamSocket>> *armed, const pollfd *slept = nullptr, size_t nslept = 0);

  // What the passes did (GPUSOCK_LOG=info prints the process's sums at exit).
  struct Stats {
    std::atomic<uint64_t> passes{0}, full_passes{0}, empty_passes{0};
    std::atomic<uint64_t> looks{0};       // members looked at
    std::atomic<uint64_t> reported{0};    // of those, ready
    std::atomic<uint64_t> not_quiet{0};   // not ready, looked at again for want of hints
    std::atomic<uint64_t> hinted{0};      // members the transport's hints named
    std::atomic<uint64_t> sleeps{0};      // sleeps begun
    std::atomic<uint64_t> sleep_arms{0};  // members those sleeps armed one by one
  };
  const Stats &stats() const { return stats_; }

 private:
  struct Member {
    short events = 0;
    const StreamSocket *socket = nullptr;  // identity: a reused fd is a new member
    int32_t slot = -1;                     // its endpoint's hint slot, in mask_
    bool watched = false;                  // group_ watches slot
    bool queued = false;                   // in look_
    uint64_t pass = 0;                     // the last pass that looked at it
  };
  struct Candidate {
    int fd;
    std::shared_ptr<StreamSocket> socket;
    int look_fd;   // StreamSocket::look_fd(), or -1
    int quiet_fd;  // look_fd when found not readable, else -1
  };
  size_t take_hints_locked();  // how many members were hinted
  // A group for the process's current domain (a forked child's differs), and
  // which members it wakes for.
  void refresh_group_locked();
  void note_alone_locked(int fd, const Member &m);
  void wake_sleepers_locked();
  void queue_locked(int fd);
  void set_slot_locked(int fd, Member &m, int32_t slot);
  void erase_locked(std::unordered_map<int, Member>::iterator it);
  // The members look_ names into batch_ (closed ones leave the set), with
  // the quiet wait fds of those without hints found in one poll(2).
  void gather_locked();

  std::mutex mu_;
  std::unordered_map<int, Member> members_;
  std::unordered_set<int> one_by_one_;  // members a sleep arms by themselves
  std::unique_ptr<wire::SleepGroup> group_;
  wire::Domain *group_domain_ = nullptr;
  uint64_t sharing_epoch_ = 0;
  struct Sleeper {
    int waker;  // the thread's (thread_waker_fd)
    std::vector<std::shared_ptr<StreamSocket>> armed;
  };
  std::vector<Sleeper> sleepers_;             // threads between begin_sleep and end_sleep
  std::vector<uint64_t> mask_;                // the members' slots, bit s % 64 of word s / 64
  std::unordered_map<int32_t, int> slot_fd_;  // slot -> member fd
  std::vector<int> look_;                     // members the next pass looks at
  std::vector<int> next_, kept_;              // scratch of a pass
  std::vector<int32_t> slots_;                // scratch: hinted slots
  std::vector<Candidate> batch_;
  std::vector<pollfd> fd_looks_;
  const std::chrono::milliseconds full_every_;
  std::chrono::steady_clock::time_point next_full_{};
  uint64_t pass_ = 0;
  Stats stats_;
};

}  // namespace gpusock::socket
