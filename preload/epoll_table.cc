// The side tables of emulated epoll instances (epoll_table.h).
#include "preload/epoll_table.h"

#include "preload/library.h"

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

namespace {

bool armed_gs(const EpollEntry &e) { return e.gs && !e.disarmed; }

}  // namespace

EpollSet::~EpollSet() {
  if (ready == nullptr) return;
  Inside guard;
  gs().ready_set_destroy(ready);
}

EpollEntry *find_entry(EpollSet &set, int fd) {
  if (set.index_dirty) {
    set.index.clear();
    for (size_t i = 0; i < set.entries.size(); ++i) set.index[set.entries[i].fd] = i;
    set.index_dirty = false;
  }
  auto it = set.index.find(fd);
  return it == set.index.end() ? nullptr : &set.entries[it->second];
}

void update_ready_member(EpollSet &set, const EpollEntry &e) {
  Inside guard;
  if (!armed_gs(e)) {
    if (set.ready != nullptr) gs().ready_set_ctl(set.ready, EPOLL_CTL_DEL, e.fd, 0);
    return;
  }
  if (set.ready == nullptr && (set.ready = gs().ready_set_create()) == nullptr) return;
  const short events = static_cast<short>(e.events & 0x3fff);
  if (gs().ready_set_ctl(set.ready, EPOLL_CTL_MOD, e.fd, events) == -ENOENT)
    gs().ready_set_ctl(set.ready, EPOLL_CTL_ADD, e.fd, events);
}

void add_entry(EpollSet &set, const EpollEntry &e) {
  set.entries.push_back(e);
  set.index_dirty = true;
  if (e.gs) set.gs_count.fetch_add(1);
  if (e.dormant) set.dormant_count.fetch_add(1);
  if (armed_gs(e)) update_ready_member(set, e);
}

void remove_entry(EpollSet &set, int fd) {
  auto &v = set.entries;
  for (size_t i = 0; i < v.size();) {
    if (v[i].fd != fd) {
      ++i;
      continue;
    }
    if (v[i].gs) set.gs_count.fetch_sub(1);
    if (v[i].dormant) set.dormant_count.fetch_sub(1);
    if (armed_gs(v[i]) && set.ready != nullptr) {
      Inside guard;
      gs().ready_set_ctl(set.ready, EPOLL_CTL_DEL, fd, 0);
    }
    v.erase(v.begin() + static_cast<long>(i));
    set.index_dirty = true;
  }
}

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
    remove_entry(*set, fd);
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
        update_ready_member(*set, e);
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
    set->index_dirty = true;
    set->gs_count = 0;
    set->ready = nullptr;  // the parent's: its lock may be held by a thread the child has not
  }
  // Reset the locks other threads may have held at fork time.
  for (auto &[epfd, set] : tables().sets) new (&set->mu) std::mutex();
}

}  // namespace gpusock::preload
