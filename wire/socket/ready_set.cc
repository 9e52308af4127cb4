#include "wire/socket/ready_set.h"
#include "wire/config.h"
#include "wire/log.h"

#include "wire/socket/engine.h"
#include "wire/socket/waiting.h"
#include "wire/transport.h"

#include <sys/epoll.h>

#include <algorithm>
#include <cstdlib>

namespace gpusock::socket {
namespace {

void add(std::atomic<uint64_t> &counter, uint64_t n) {
  if (n != 0) counter.fetch_add(n, std::memory_order_relaxed);
}

void sum_into(ReadySet::Stats &to, const ReadySet::Stats &from) {
  const auto get = [](const std::atomic<uint64_t> &c) { return c.load(std::memory_order_relaxed); };
  add(to.passes, get(from.passes));
  add(to.full_passes, get(from.full_passes));
  add(to.empty_passes, get(from.empty_passes));
  add(to.looks, get(from.looks));
  add(to.reported, get(from.reported));
  add(to.not_quiet, get(from.not_quiet));
  add(to.hinted, get(from.hinted));
  add(to.sleeps, get(from.sleeps));
  add(to.sleep_arms, get(from.sleep_arms));
}

// The process's sets, and the sums of those gone, for the counts at exit.
// Never destroyed: sets may go after static destructors.
struct Registry {
  std::mutex mu;
  std::vector<const ReadySet *> live;
  ReadySet::Stats gone;
  bool logging = false;
};

Registry &registry() {
  static auto *r = new Registry();
  return *r;
}

void log_stats_at_exit() {
  ReadySet::Stats sum;
  Registry &r = registry();
  {
    std::lock_guard lock(r.mu);
    sum_into(sum, r.gone);
    for (const ReadySet *set : r.live) sum_into(sum, set->stats());
  }
  const auto get = [](const std::atomic<uint64_t> &c) { return static_cast<unsigned long long>(c.load()); };
  log::write(log::kInfo, "socket",
             "readiness sets: %llu passes (%llu full, %llu empty), %llu looks, %llu ready, %llu looked at "
             "again for want of hints, %llu hinted; %llu sleeps arming %llu members one by one",
             get(sum.passes), get(sum.full_passes), get(sum.empty_passes), get(sum.looks), get(sum.reported),
             get(sum.not_quiet), get(sum.hinted), get(sum.sleeps), get(sum.sleep_arms));
}

}  // namespace

ReadySet::ReadySet() : full_every_(std::chrono::milliseconds(config::get(config::Id::kReadySetFullMs))) {
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  if (!r.logging) {
    r.logging = true;
    std::atexit(&log_stats_at_exit);
  }
  r.live.push_back(this);
}

ReadySet::~ReadySet() {
  if (group_ && group_domain_ != Engine::get().opened_domain()) {
    (void)group_.release();  // a forked child's copy of its parent's group: the parent's to tear down
  } else if (group_) {
    for (auto &[fd, m] : members_)
      if (m.watched) group_->watch(m.slot, false);
  }
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), this), r.live.end());
  sum_into(r.gone, stats_);
}

void ReadySet::note_alone_locked(int fd, const Member &m) {
  if (m.watched && group_->wakes_for(m.slot)) one_by_one_.erase(fd);
  else if (one_by_one_.insert(fd).second) queue_locked(fd);  // another set may have taken its hints
}

void ReadySet::set_slot_locked(int fd, Member &m, int32_t slot) {
  if (m.slot == slot) return;
  if (m.slot >= 0) {
    mask_[static_cast<size_t>(m.slot) / 64] &= ~(uint64_t{1} << (m.slot % 64));
    slot_fd_.erase(m.slot);
    if (m.watched) group_->watch(m.slot, false);
    m.watched = false;
  }
  m.slot = slot;
  if (slot >= 0) {
    const size_t word = static_cast<size_t>(slot) / 64;
    if (mask_.size() <= word) mask_.resize(word + 1, 0);
    mask_[word] |= uint64_t{1} << (slot % 64);
    slot_fd_[slot] = fd;
    if (group_) group_->watch(slot, true);
    m.watched = group_ != nullptr;
  }
  note_alone_locked(fd, m);
}

void ReadySet::erase_locked(std::unordered_map<int, Member>::iterator it) {
  set_slot_locked(it->first, it->second, -1);
  one_by_one_.erase(it->first);
  members_.erase(it);  // a stale entry in look_ is skipped
}

void ReadySet::refresh_group_locked() {
  wire::Domain *domain = Engine::get().opened_domain();
  bool rescan = false;
  if (domain != group_domain_) {
    if (group_domain_ != nullptr) (void)group_.release();  // a forked child: the old group is its parent's
    group_domain_ = domain;
    group_ = domain != nullptr ? domain->open_sleep_group() : nullptr;
    for (auto &[fd, m] : members_) {
      m.watched = group_ != nullptr && m.slot >= 0;
      if (m.watched) group_->watch(m.slot, true);
    }
    rescan = true;
  }
  if (group_ && group_->sharing_epoch() != sharing_epoch_) {
    sharing_epoch_ = group_->sharing_epoch();
    rescan = true;
  }
  if (rescan)
    for (auto &[fd, m] : members_) note_alone_locked(fd, m);
}

int ReadySet::ctl(int op, int fd, short events) {
  auto socket = Engine::get().find(fd);
  if (!socket) return -ENOTSOCK;
  std::lock_guard lock(mu_);
  auto it = members_.find(fd);
  switch (op) {
    case EPOLL_CTL_ADD:
      if (it != members_.end()) {
        if (it->second.socket == socket.get()) return -EEXIST;
        erase_locked(it);  // the fd of a socket closed behind our back
      }
      members_[fd] = Member{events, socket.get()};
      one_by_one_.insert(fd);
      queue_locked(fd);
      wake_sleepers_locked();  // as the kernel's epoll: a sleep sees members added meanwhile
      return 0;
    case EPOLL_CTL_MOD:
      if (it == members_.end()) return -ENOENT;
      it->second.events = events;
      queue_locked(fd);
      wake_sleepers_locked();
      return 0;
    case EPOLL_CTL_DEL:
      if (it == members_.end()) return -ENOENT;
      erase_locked(it);
      return 0;
    default:
      return -EINVAL;
  }
}

void ReadySet::queue_locked(int fd) {
  auto it = members_.find(fd);
  if (it == members_.end() || it->second.queued) return;
  it->second.queued = true;
  look_.push_back(fd);
}

size_t ReadySet::take_hints_locked() {
  wire::Domain *domain = Engine::get().opened_domain();
  if (domain == nullptr || mask_.empty()) return 0;
  slots_.clear();
  domain->take_hints(mask_.data(), mask_.size(), &slots_);
  for (int32_t slot : slots_)
    if (auto it = slot_fd_.find(slot); it != slot_fd_.end()) queue_locked(it->second);
  add(stats_.hinted, slots_.size());
  return slots_.size();
}

void ReadySet::gather_locked() {
  batch_.clear();
  ++pass_;
  for (int fd : look_) {
    auto it = members_.find(fd);
    if (it == members_.end() || it->second.pass == pass_) continue;  // gone, or named twice (deleted, added again)
    it->second.pass = pass_;
    auto socket = Engine::get().find(fd);
    if (!socket || socket.get() != it->second.socket) {  // closed behind the caller's back, or the fd reused
      erase_locked(it);
      continue;
    }
    const int look_fd = it->second.slot >= 0 ? -1 : socket->look_fd();
    batch_.push_back(Candidate{fd, std::move(socket), look_fd, -1});
  }
  // Members without hints whose transport lets a quiet wait fd stand for an
  // idle endpoint (tcp): one poll(2) over those fds, as gs_poll does.
  fd_looks_.clear();
  for (const Candidate &c : batch_)
    if (c.look_fd >= 0) fd_looks_.push_back({c.look_fd, POLLIN, 0});
  if (fd_looks_.empty() || ::poll(fd_looks_.data(), fd_looks_.size(), 0) < 0) return;
  size_t k = 0;
  for (Candidate &c : batch_)
    if (c.look_fd >= 0 && fd_looks_[k++].revents == 0) c.quiet_fd = c.look_fd;
}

bool ReadySet::begin_sleep(std::vector<SleepMember> *out, int *group_fd) {
  std::lock_guard lock(mu_);
  refresh_group_locked();
  if (group_) {
    group_->arm();           // then take the hints (shm_hints.h), and see whether
    refresh_group_locked();  // another set began watching a member meanwhile
  }
  if (take_hints_locked() > 0) {
    if (group_ && sleepers_.empty()) group_->disarm(false);
    return false;
  }
  ++pass_;
  const auto add_member = [&](int fd) {
    auto it = members_.find(fd);
    if (it == members_.end() || it->second.pass == pass_) return;
    Member &m = it->second;
    m.pass = pass_;
    if (auto socket = Engine::get().find(fd); socket && socket.get() == m.socket)
      out->push_back(SleepMember{std::move(socket), m.events, !m.queued});
  };
  for (int fd : one_by_one_) add_member(fd);
  for (int fd : look_) add_member(fd);  // news at the last look
  *group_fd = group_ ? group_->fd() : -1;
  Sleeper &me = sleepers_.emplace_back(Sleeper{thread_waker_fd(), {}});
  for (const SleepMember &m : *out) me.armed.push_back(m.socket);
  add(stats_.sleeps, 1);
  add(stats_.sleep_arms, out->size());
  return true;
}

bool ReadySet::end_sleep(std::vector<std::shared_ptr<StreamSocket>> *armed, const pollfd *slept, size_t nslept) {
  std::lock_guard lock(mu_);
  const int waker = thread_waker_fd();
  const auto it = std::find_if(sleepers_.begin(), sleepers_.end(), [&](const Sleeper &s) { return s.waker == waker; });
  if (it == sleepers_.end()) return false;
  if (armed != nullptr) *armed = std::move(it->armed);
  sleepers_.erase(it);
  // The last sleeper reads the group's wake-ups: one read by another thread
  // would leave this one asleep with the word taken.
  if (sleepers_.empty() && group_) group_->disarm(polled_readable(group_->fd(), slept, nslept));
  return true;
}

void ReadySet::wake_sleepers_locked() {
  for (const Sleeper &s : sleepers_) wake_sleeper(s.waker);
}

int ReadySet::poll(pollfd *out, int max, bool *all) {
  std::lock_guard lock(mu_);
  refresh_group_locked();
  take_hints_locked();
  const auto now = std::chrono::steady_clock::now();
  const bool full = now >= next_full_;
  if (full) {
    next_full_ = now + full_every_;
    for (auto &[fd, m] : members_) queue_locked(fd);
  }
  if (all != nullptr) *all = full;
  gather_locked();
  int n = 0;
  uint64_t looks = 0, not_quiet = 0;
  next_.clear();
  kept_.clear();
  for (Candidate &c : batch_) {
    Member &m = members_[c.fd];
    if (n >= max) {
      next_.push_back(c.fd);
      continue;
    }
    bool quiet = false;
    int32_t slot = -1;
    const short ready = c.socket->look_for_set(m.events, c.quiet_fd, &slot, &quiet);
    set_slot_locked(c.fd, m, slot);
    // A hint another set may take (a member of two sets) promises nothing.
    quiet = quiet && one_by_one_.count(c.fd) == 0;
    ++looks;
    if (ready != 0) out[n++] = pollfd{c.fd, m.events, ready};
    not_quiet += ready == 0 && !quiet;
    if (ready != 0 || !quiet) kept_.push_back(c.fd);
    else m.queued = false;
  }
  batch_.clear();                                         // no socket kept alive by the set between passes
  next_.insert(next_.end(), kept_.begin(), kept_.end());  // those not looked at go first next time
  look_.swap(next_);
  add(stats_.passes, 1);
  add(stats_.full_passes, full);
  add(stats_.empty_passes, n == 0);
  add(stats_.looks, looks);
  add(stats_.reported, static_cast<uint64_t>(n));
  add(stats_.not_quiet, not_quiet);
  return n;
}

}  // namespace gpusock::socket
