// The side tables of emulated epoll instances (epoll_table.h).
#include "preload/epoll_table.h"

#include <algorithm>
#include <new>
#include <unordered_map>

namespace gpusock::preload {

namespace {

struct Tables {
  std::mutex mu;
  std::unordered_map<int, std::shared_ptr<EpollSet>> sets;
};

// Never destroyed: the library's threads may run after static destructors.
Tables &tables() {
  static auto *t = new Tables();
  return *t;
}

std::vector<std::shared_ptr<EpollSet>> all_sets() {
  std::lock_guard lock(tables().mu);
  std::vector<std::shared_ptr<EpollSet>> v;
  for (auto &[fd, s] : tables().sets)
    if (std::find(v.begin(), v.end(), s) == v.end()) v.push_back(s);
  return v;
}

}  // namespace

std::mutex &epoll_table_mutex() { return tables().mu; }

std::shared_ptr<EpollSet> find_epoll_set(int epfd) {
  std::lock_guard lock(tables().mu);
  auto it = tables().sets.find(epfd);
  return it == tables().sets.end() ? nullptr : it->second;
}

std::shared_ptr<EpollSet> find_or_make_epoll_set(int epfd) {
  std::lock_guard lock(tables().mu);
  auto &s = tables().sets[epfd];
  if (!s) {
    s = std::make_shared<EpollSet>();
    s->numbers.push_back(epfd);
    set_kind(epfd, kEpoll);
  }
  return s;
}

void epoll_forget_fd(int fd) {
  for (auto &set : all_sets()) {
    std::lock_guard lock(set->mu);
    auto &v = set->entries;
    for (size_t i = 0; i < v.size();) {
      if (v[i].fd == fd) {
        if (v[i].gs) set->gs_count.fetch_sub(1);
        if (v[i].dormant) set->dormant_count.fetch_sub(1);
        v.erase(v.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  }
}

void epoll_upgrade_fd(int fd) {
  for (auto &set : all_sets()) {
    std::lock_guard lock(set->mu);
    for (auto &e : set->entries)
      if (e.fd == fd && !e.gs) {
        e.gs = true;  // the kernel dropped its registration with the old socket
        set->gs_count.fetch_add(1);
        if (e.dormant) set->dormant_count.fetch_sub(1);
        e.dormant = false;
      }
  }
}

bool epoll_has_fd(int fd) {
  for (auto &set : all_sets()) {
    std::lock_guard lock(set->mu);
    for (const auto &e : set->entries)
      if (e.fd == fd) return true;
  }
  return false;
}

void epoll_forget_epfd(int epfd) {
  std::lock_guard lock(tables().mu);
  auto it = tables().sets.find(epfd);
  if (it == tables().sets.end()) return;
  auto &nums = it->second->numbers;
  nums.erase(std::remove(nums.begin(), nums.end(), epfd), nums.end());
  tables().sets.erase(it);
}

void epoll_dup_epfd(int oldfd, int newfd) {
  std::lock_guard lock(tables().mu);
  auto it = tables().sets.find(oldfd);
  if (it == tables().sets.end()) return;
  auto set = it->second;
  set->numbers.push_back(newfd);
  tables().sets[newfd] = set;
  set_kind(newfd, kEpoll);
}

// In a forked child the gpusock members are kernel sockets now (fork relays):
// hand them to the real epoll instance.
void epoll_after_fork_child() {
  const Real &R = real();
  for (auto &[epfd, set] : tables().sets) {
    if (set->numbers.empty() || set->numbers.front() != epfd) continue;
    for (auto &e : set->entries) {
      if (!e.gs) continue;
      if (kind_of(e.fd) == kDormant) {  // an inherited listener: watched once it is active
        e.gs = false;
        e.dormant = true;
        set->dormant_count.fetch_add(1);
        continue;
      }
      epoll_event ev{};
      ev.events = e.disarmed ? (e.events & (EPOLLET | EPOLLONESHOT)) : e.events;
      ev.data = e.data;
      R.epoll_ctl(epfd, EPOLL_CTL_ADD, e.fd, &ev);
    }
    set->entries.erase(
        std::remove_if(set->entries.begin(), set->entries.end(), [](const EpollEntry &e) { return e.gs; }),
        set->entries.end());
    set->gs_count = 0;
  }
  // Reset the locks other threads may have held at fork time.
  for (auto &[epfd, set] : tables().sets) new (&set->mu) std::mutex();
}

}  // namespace gpusock::preload
