// Bells: waking a sleeping fabric:shm endpoint from another process.
//
// libfabric 1.17's shm has no cross-process wake-up: a sender enqueues into
// the receiver's region and sets the region's `signal` word, and the receiver
// only notices when it next calls the provider. A bell adds what a sleeper
// needs:
//   - a page appended to the endpoint's own region file (shm maps only its
//     total_size, so the page is ours; it goes with the region: shm unlinks
//     the file on close, the sweep of dead processes' files removes it), with
//     an `armed` word (the owner is about to sleep), a `requests` counter
//     (ring-back requests, below) and a `closed` word (a listener that takes
//     no more requests);
//   - a UNIX datagram socket bound at /dev/shm/<endpoint name>.bell: the
//     endpoint's wait_fd. A path, not the abstract namespace, so that a bell
//     is reachable wherever the region is (same /dev/shm), whatever the
//     network namespace. Removed on close and by the sweep (shm_names.h).
//
// Waking (no lost wake-up). The sleeper:  armed = 1; fence; look at its own
// region's `signal` (and its other sources) -> something: do not sleep.
// A peer, after a provider call that may have stored the sleeper's signal = 1
// (seq_cst: shm does on every enqueue into a region and every response to
// it; so after a post, and after a progress pass that consumed the sleeper's
// commands):  fence; if armed and signal, exchange armed to 0 and send one
// byte to the bell. Both sides put a seq_cst fence between their store and
// their load, so in the single total order of those fences one of the two
// loads comes after the other side's store: either the sleeper sees
// signal = 1 and polls, or the peer sees armed = 1 (and the signal it
// stored) and rings. Looking at the signal too means a peer that polls all
// the time rings only when there is something to wake for; the exchange lets
// one peer ring per sleep. The same holds for every other thing a sleeper
// waits for that comes with a store to shared memory it re-checks after
// arming: a dead peer (the watchdog's flag; the watchdog also rings), an
// in-process peer gone (its `alive` flag; it rings its senders), a listener
// closing (the `closed` word here).
//
// Ring-back. Some waits come with no store to the waiter's memory: a send
// refused with -FI_EAGAIN until the peer progresses (shm's first message to a
// peer waits for the peer to process shm's name exchange; a full command
// queue waits for the peer to consume). The blocked sender, before sleeping,
// sends its own endpoint name to the peer's bell and then increments the
// peer's `requests`. The peer collects the names (before a progress pass)
// and, after that pass, sends one byte to each. What the sender waited for
// was enqueued before its request, so that pass has processed it. The
// datagram also wakes a sleeping peer; a busy one sees `requests` move.
// A request that cannot be delivered (ECONNREFUSED, ENOENT) means the peer
// endpoint is gone.
//
// Admission. shm 1.17 keeps one table of peers per endpoint (256 entries) and
// fills it from a client's first send (its name exchange), before the
// listener knows of that client; one entry too many overwrites another peer
// and the listener crashes in fi_cq_read. So a client takes one of the
// listener's admissions (a counter in the listener's bell page) before it
// sends anything there, and the listener gives it back when it has removed
// that client from its table (the request answered or refused). A client
// without one waits, its bell rung by the watchdog after a growing pause
// (shm_watchdog.h), and is admitted as the listener's queue drains: a storm
// of connects queues where the kernel's SYN backlog would.
#pragma once

#include "wire/fabric/creator.h"
#include "wire/fabric/shm_hints.h"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace gpusock::wire::fabric::shm {

constexpr size_t kBellPageSize = 4096;

struct BellPage {
  uint32_t magic;
  uint32_t version;
  alignas(64) std::atomic<uint32_t> armed;     // written by the owner and by waking senders
  alignas(64) std::atomic<uint32_t> requests;  // ring-back requests sent so far
  std::atomic<uint32_t> closed;                // a listener that takes no more requests
  uint32_t hint_slot;                          // slot + 1 on the board named next; 0: none
  char hint_board[64];
  uint32_t marks_hints;  // kMarksHintsVersion: this endpoint marks its peers' hint bits
  // Listeners only (see "Admission"): clients admitted so far, and admissions
  // given back; at most admission_cap admitted and not given back. 0: none kept.
  alignas(64) std::atomic<uint32_t> admitted;
  std::atomic<uint32_t> released;
  uint32_t admission_cap;
};
static_assert(sizeof(BellPage) <= kBellPageSize, "one page");

// A socket to ring bells from (unbound, non-blocking, close-on-exec), or -1.
int open_ringer();

// One datagram from `ringer` to the bell at `path`: 0, or a negated errno
// (-ECONNREFUSED / -ENOENT: nobody owns that bell any more; -EAGAIN: its queue
// is full: readable already, but this datagram is not in it).
int send_to_bell(int ringer, const std::string &path, const void *data, size_t len);

// A socket bound at `path` to receive rings (non-blocking, close-on-exec),
// or -1 with errno.
int bind_bell(const std::string &path);
// A socket connected to the bell at `path`, or -1.
int connect_to_bell(const std::string &path);
// One wake-up byte down a connected ringer: 0 or a negated errno (-EAGAIN:
// the bell's queue is full, so it is readable already).
int ring_connected(int sock);
// Reads every datagram waiting on a bell socket; true if there was any.
bool drain_bell_socket(int sock);

// What a bell page's marks_hints says: the endpoint marks its peers' hint
// bits and wakes their sleep groups (shm_hints.h). An older value: neither.
constexpr uint32_t kMarksHintsVersion = 2;

// Our own bell. Not thread-safe: its endpoint serialises calls.
class Bell {
 public:
  Bell() = default;
  Bell(const Bell &) = delete;
  Bell &operator=(const Bell &) = delete;
  ~Bell();

  // For region `name`, right after fi_enable and before the name is
  // published. False: no bell (region layout not 1.17's, or out of
  // resources); the endpoint then has no wait fd and never sleeps.
  // `board` and `slot` (-1: none): where senders mark our news (shm_hints.h).
  bool open(const std::string &name, const HintBoard *board = nullptr, int32_t slot = -1);
  bool valid() const { return sock_ >= 0; }
  int fd() const { return sock_; }

  // Our region's `signal` word: shm has enqueued or responded to us and we
  // have not progressed since. A load.
  bool signalled() const { return signal_ != nullptr && __atomic_load_n(signal_, __ATOMIC_RELAXED) != 0; }
  // Ring-back requests not yet collected, or collected and not yet served.
  bool requests_pending() const {
    return page_ != nullptr && page_->requests.load(std::memory_order_relaxed) != requests_seen_;
  }
  bool has_requesters() const { return !requesters_.empty(); }

  // armed = 1, then a seq_cst fence: re-check everything after it.
  void arm() {
    drained_ = false;  // rung from now on
    page_->armed.store(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  void disarm() { page_->armed.store(0, std::memory_order_relaxed); }

  // Read every datagram waiting: wake-ups, and ring-back requests (kept for
  // serve_requests). True if there was any.
  bool drain();
  // drain(), unless the last drain found the queue empty and the bell has
  // not been armed since: only an armed bell is rung, and what comes unarmed
  // (a watchdog's wake, a ring-back, a departing in-process peer's ring)
  // comes with a flag or counter the next arming looks at, or is a ring sent
  // late that costs one early wake-up. Arming again right after a drain (the
  // usual wake: drain, -EAGAIN, a progress pass, arm) then makes no second,
  // empty read.
  bool drain_unless_drained() { return !drained_ && drain(); }
  // Listeners: keep at most `cap` clients admitted (see "Admission").
  void open_admissions(uint32_t cap) { page_->admission_cap = cap; }
  // `count` clients admitted here are out of our table again.
  void release_admissions(uint32_t count) {
    if (page_ != nullptr && page_->admission_cap != 0) page_->released.fetch_add(count, std::memory_order_acq_rel);
  }
  // Take the requests counted so far (call before a progress pass).
  void collect_requests();
  // Ring everyone whose request was collected (call after the pass).
  void serve_requests(int ringer);
  // No more sleeping here: set `closed`, serve every request, close and
  // remove the socket (later requests fail: the sender learns we are gone).
  void close_for_good(int ringer);

 private:
  int sock_ = -1;
  std::string path_;
  Creator creator_;  // only it closes the bell for good and unlinks it
  BellPage *page_ = nullptr;
  void *head_map_ = nullptr;
  const int32_t *signal_ = nullptr;
  uint32_t requests_seen_ = 0;
  bool drained_ = false;  // the last drain() found the queue empty; not armed since
  std::vector<std::string> requesters_;
};

// A peer's bell, as its senders see it. Move-only.
class PeerBell {
 public:
  static constexpr int kConnectedRingers = 64;

  PeerBell() = default;
  PeerBell(const PeerBell &) = delete;
  PeerBell &operator=(const PeerBell &) = delete;
  PeerBell(PeerBell &&other) noexcept { *this = std::move(other); }
  PeerBell &operator=(PeerBell &&other) noexcept;
  ~PeerBell() { reset(); }

  // Map endpoint `name`'s bell page and its region's head; rings go from
  // `ringer`. False when that endpoint has no bell (it never sleeps then).
  bool open(const std::string &name, int ringer);
  void reset();
  bool valid() const { return page_ != nullptr; }

  // After a provider call that may have signalled the peer's region (a post,
  // a progress pass): if it sleeps with something to do, wake it. A fence and
  // a load unless it sleeps.
  void wake_if_armed() const {
    if (page_ == nullptr) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (__atomic_load_n(signal_, __ATOMIC_RELAXED) == 0) return;
    hint_.mark();
    if (page_->armed.load(std::memory_order_relaxed) != 0 && page_->armed.exchange(0) != 0) ring();
  }
  // Ask the peer to ring `our_name`'s bell after its next progress pass.
  // 0; -ENOTSUP (the peer has no bell); -ECONNREFUSED (its endpoint is gone);
  // another negated errno (-EAGAIN: its queue is full) when the request could
  // not go now.
  int request_ringback(const std::string &our_name) const;
  // The peer marks our hint bit whenever it may have news for us (an older
  // gpusock does not: then only looking tells).
  bool marks_hints() const { return page_ != nullptr && page_->marks_hints >= kMarksHintsVersion; }
  // Admission to the peer, a listener (see "Admission"): true when taken (or
  // when that listener keeps none); false: wait until admission_open().
  bool take_admission() const;
  bool admission_open() const { return page_ == nullptr || page_->admission_cap == 0 || !all_admitted(admitted()); }
  // The peer (a listener) takes no more requests.
  bool closed() const { return page_ != nullptr && page_->closed.load(std::memory_order_relaxed) != 0; }
  // One byte to the peer's bell.
  int ring() const;

 private:
  uint32_t admitted() const { return page_->admitted.load(std::memory_order_acquire); }
  // With `taken` admitted: none left. Wrapping differences: released may run
  // ahead of admitted with clients that keep no count (an older gpusock).
  bool all_admitted(uint32_t taken) const {
    return static_cast<int32_t>(taken - page_->released.load(std::memory_order_acquire)) >=
           static_cast<int32_t>(page_->admission_cap);
  }
  BellPage *page_ = nullptr;
  void *head_map_ = nullptr;
  const int32_t *signal_ = nullptr;  // the peer region's
  std::string path_;
  // A socket connected to the peer's bell, made at the first ring while the
  // process holds fewer than kConnectedRingers of them: a ring is then one
  // send() (a sendto by path walks the path every time, which costs a busy
  // server more than the rest of its reply); beyond them a ring goes by path
  // from the domain's ringer, so a connection costs two descriptors however
  // many there are (the socket's number and its bell).
  void drop_connected() const;
  mutable int connected_ = -1;
  int ringer_ = -1;
  PeerHint hint_;  // the peer's bit on its board, when it has one
};

}  // namespace gpusock::wire::fabric::shm
