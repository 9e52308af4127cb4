#include "wire/socket/ready_set.h"

#include "wire/socket/engine.h"
#include "wire/socket/waiting.h"

#include <sys/epoll.h>

#include <algorithm>

namespace gpusock::socket {
namespace {

// The process's sets by id, for handing hints over. Never destroyed: sets may
// go after static destructors.
struct Registry {
  std::mutex mu;
  uint32_t next_id = 1;  // 0 would make token 0, "nobody"
  std::unordered_map<uint32_t, ReadySet *> sets;
};

Registry &registry() {
  static auto *r = new Registry();
  return *r;
}

uint32_t register_set(ReadySet *set) {
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  const uint32_t id = r.next_id++;
  r.sets[id] = set;
  return id;
}

void hand_over(uint64_t owner) {
  Registry &r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.sets.find(static_cast<uint32_t>(owner >> 32));
  if (it != r.sets.end()) it->second->post(static_cast<int>(static_cast<uint32_t>(owner)));
}

}  // namespace

ReadySet::ReadySet()
    : id_(register_set(this)), full_every_(std::chrono::milliseconds(env_or("GPUSOCK_READY_SET_FULL_MS", 10))) {}

ReadySet::~ReadySet() {
  {
    Registry &r = registry();
    std::lock_guard lock(r.mu);
    r.sets.erase(id_);
  }
  std::lock_guard lock(mu_);
  for (auto &[fd, m] : members_)
    if (m.hinted)
      if (auto socket = Engine::get().find(fd); socket && socket.get() == m.socket) socket->set_hint_owner(0);
}

int ReadySet::ctl(int op, int fd, short events) {
  auto socket = Engine::get().find(fd);
  if (!socket) return -ENOTSOCK;
  std::lock_guard lock(mu_);
  auto it = members_.find(fd);
  switch (op) {
    case EPOLL_CTL_ADD:
      if (it != members_.end() && it->second.socket == socket.get()) return -EEXIST;
      members_[fd] = Member{events, socket.get(), false, false};
      queue_locked(fd);
      return 0;
    case EPOLL_CTL_MOD:
      if (it == members_.end()) return -ENOENT;
      it->second.events = events;
      queue_locked(fd);
      return 0;
    case EPOLL_CTL_DEL:
      if (it == members_.end()) return -ENOENT;
      if (it->second.hinted && it->second.socket == socket.get()) socket->set_hint_owner(0);
      members_.erase(it);  // a stale entry in look_ is skipped
      return 0;
    default:
      return -EINVAL;
  }
}

void ReadySet::post(int fd) {
  std::lock_guard lock(inbox_mu_);
  inbox_.push_back(fd);
}

void ReadySet::queue_locked(int fd) {
  auto it = members_.find(fd);
  if (it == members_.end() || it->second.queued) return;
  it->second.queued = true;
  look_.push_back(fd);
}

void ReadySet::take_hints_locked() {
  wire::Domain *domain = Engine::get().opened_domain();
  owners_.clear();
  if (domain != nullptr) domain->take_hints(&owners_);
  for (uint64_t owner : owners_) {
    if (static_cast<uint32_t>(owner >> 32) == id_) queue_locked(static_cast<int>(static_cast<uint32_t>(owner)));
    else hand_over(owner);
  }
  std::vector<int> inbox;
  {
    std::lock_guard lock(inbox_mu_);
    inbox.swap(inbox_);
  }
  for (int fd : inbox) queue_locked(fd);
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
      members_.erase(it);
      continue;
    }
    const int look_fd = it->second.hinted ? -1 : socket->look_fd();
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

int ReadySet::poll(pollfd *out, int max, bool *all) {
  std::lock_guard lock(mu_);
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
  next_.clear();
  kept_.clear();
  for (Candidate &c : batch_) {
    Member &m = members_[c.fd];
    if (n >= max) {
      next_.push_back(c.fd);
      continue;
    }
    bool quiet = false;
    const short ready = c.socket->look_for_set(m.events, c.quiet_fd, token(c.fd), &m.hinted, &quiet);
    if (ready != 0) out[n++] = pollfd{c.fd, m.events, ready};
    if (ready != 0 || !quiet) kept_.push_back(c.fd);
    else m.queued = false;
  }
  batch_.clear();                                         // no socket kept alive by the set between passes
  next_.insert(next_.end(), kept_.begin(), kept_.end());  // those not looked at go first next time
  look_.swap(next_);
  return n;
}

}  // namespace gpusock::socket
