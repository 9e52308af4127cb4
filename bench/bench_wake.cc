// bench_wake [bells]: what waking a sleeping thread costs, by the means a
// fabric:shm peer has (shm_bell.h) and the means it could have.
//
// Two threads ping-pong a wake-up: each sleeps until the other wakes it,
// then wakes the other. One JSON line per means with the round trip (two
// sleeps and two wake-ups) and the waker's call alone (a wake of a bell
// nobody sleeps on, drained now and then):
//   bell_path       a datagram to the bell's path (send_to_bell): the ring of
//                   a peer beyond the first PeerBell::kConnectedRingers
//   bell_connected  a datagram down a connected socket (ring_connected)
//   eventfd         a thread's waker (socket/waiting.h: an eventfd write)
//   futex           FUTEX_WAKE on a shared word the sleeper waits on
// Sleepers of the first three sleep in ppoll and read what woke them, as
// gpusock's do. `bells` (default 2048) other bells are bound in /dev/shm
// beside the two, as a process with that many connections has.
#include "wire/fabric/shm_bell.h"
#include "wire/fabric/shm_names.h"

#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace shm = gpusock::wire::fabric::shm;
using Clock = std::chrono::steady_clock;

constexpr int kRounds = 20000;
constexpr int kCalls = 200000;

// One side's way to be woken and to wake the other.
struct Means {
  virtual ~Means() = default;
  virtual void sleep(int side) = 0;
  virtual void wake(int side) = 0;  // wakes `side`
};

// A bell (or eventfd) per side; ppoll, then read what came.
struct FdMeans : Means {
  int fds[2] = {-1, -1};
  std::function<void(int)> ring;  // rings side's fd
  void sleep(int side) override {
    pollfd p{fds[side], POLLIN, 0};
    while (ppoll(&p, 1, nullptr, nullptr) < 1) {}
    uint64_t buf[16];
    (void)!read(fds[side], buf, sizeof buf);
  }
  void wake(int side) override { ring(side); }
};

struct FutexMeans : Means {
  std::atomic<uint32_t> word[2] = {0, 0};
  void sleep(int side) override {
    while (word[side].exchange(0) == 0)
      syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word[side]), FUTEX_WAIT, 0, nullptr, nullptr, 0);
  }
  void wake(int side) override {
    word[side].store(1);
    syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word[side]), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
};

double round_trip_us(Means &m) {
  std::thread other([&] {
    for (int i = 0; i < kRounds; ++i) {
      m.sleep(1);
      m.wake(0);
    }
  });
  const auto t0 = Clock::now();
  for (int i = 0; i < kRounds; ++i) {
    m.wake(1);
    m.sleep(0);
  }
  const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  other.join();
  return us / kRounds;
}

// The waker's call alone, nobody asleep: `drain` empties the target now and
// then (a bell's queue holds a few datagrams).
template <class Call, class Drain>
double call_us(Call call, Drain drain) {
  const auto t0 = Clock::now();
  for (int i = 0; i < kCalls; ++i) {
    call();
    if (i % 8 == 7) drain();
  }
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / kCalls;
}

void report(const char *means, int bells, double rt, double call) {
  std::printf("{\"means\":\"%s\",\"other_bells\":%d,\"round_trip_us\":%.3f,\"wake_call_us\":%.3f}\n", means, bells, rt,
              call);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  const int other_bells = argc > 1 ? std::atoi(argv[1]) : 2048;
  std::vector<std::string> paths;
  std::vector<int> crowd;
  for (int i = 0; i < other_bells; ++i) {
    paths.push_back(shm::bell_path(shm::new_endpoint_name(nullptr)));
    crowd.push_back(shm::bind_bell(paths.back()));
  }
  std::string bell_paths[2];
  int bells[2];
  for (int s = 0; s < 2; ++s) {
    bell_paths[s] = shm::bell_path(shm::new_endpoint_name(nullptr));
    bells[s] = shm::bind_bell(bell_paths[s]);
    if (bells[s] < 0) {
      std::perror("bind_bell");
      return 1;
    }
  }
  const int ringer = shm::open_ringer();
  const int connected[2] = {shm::connect_to_bell(bell_paths[0]), shm::connect_to_bell(bell_paths[1])};
  const char one = 1;

  FdMeans path;
  path.fds[0] = bells[0];
  path.fds[1] = bells[1];
  path.ring = [&](int side) { (void)shm::send_to_bell(ringer, bell_paths[side], &one, 1); };
  report("bell_path", other_bells, round_trip_us(path),
         call_us([&] { (void)shm::send_to_bell(ringer, bell_paths[0], &one, 1); },
                 [&] { shm::drain_bell_socket(bells[0]); }));

  FdMeans conn = path;
  conn.ring = [&](int side) { (void)shm::ring_connected(connected[side]); };
  report("bell_connected", other_bells, round_trip_us(conn),
         call_us([&] { (void)shm::ring_connected(connected[0]); }, [&] { shm::drain_bell_socket(bells[0]); }));

  FdMeans event;
  event.fds[0] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  event.fds[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const auto write_one = [](int fd) {
    const uint64_t v = 1;
    (void)!write(fd, &v, sizeof v);
  };
  event.ring = [&](int side) { write_one(event.fds[side]); };
  report("eventfd", 0, round_trip_us(event),
         call_us([&] { write_one(event.fds[0]); },
                 [&] {
                   uint64_t v;
                   (void)!read(event.fds[0], &v, sizeof v);
                 }));

  FutexMeans futex;
  report("futex", 0, round_trip_us(futex), call_us([&] { futex.wake(0); }, [&] { futex.word[0].store(0); }));

  for (int s = 0; s < 2; ++s) {
    close(bells[s]);
    close(connected[s]);
    unlink(bell_paths[s].c_str());
    close(event.fds[s]);
  }
  for (size_t i = 0; i < crowd.size(); ++i) {
    if (crowd[i] >= 0) close(crowd[i]);
    unlink(paths[i].c_str());
  }
  close(ringer);
  return 0;
}
