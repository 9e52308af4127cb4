// A fabric:shm listener and name exchanges whose sender's region cannot be
// opened (wire/fabric/shm_name_exchange.h). The test plays the peer at the
// byte level: it enqueues shm 1.17's name exchange into the listener's
// command queue as a client's first send does (libfabric's smr_send_name),
// naming a region that no longer exists, as a client killed and swept before
// the listener progressed leaves it. shm alone dies in fi_cq_read on it.
#include "test-support/timing.h"
#include "wire/config.h"
#include "wire/fabric/shm_names.h"
#include "wire/fabric/shm_region.h"
#include "wire/transport.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using namespace gpusock::wire;
namespace shm = gpusock::wire::fabric::shm;
namespace test = gpusock::test;

constexpr int kWaitMs = 20000;

// What smr_send_name writes (shm 1.17): a command of 256 bytes whose header
// has op SMR_OP_MAX + ofi_ctrl_connreq, the sender's id for us, its pid, and
// an inject buffer popped from our pool holding its region's name.
void enqueue_name_exchange(const std::string &region, const std::string &sender) {
  shm::ShmRegionHead head{};
  char *base = static_cast<char *>(shm::map_region(region, &head));
  ASSERT_NE(base, nullptr);
  auto *queue = reinterpret_cast<shm::ShmCirqueHead *>(base + head.cmd_queue_offset);
  char *pool = base + head.inject_pool_offset;
  uint64_t entry_base, object_size;
  std::memcpy(&entry_base, pool, 8);
  std::memcpy(&object_size, pool + 8, 8);
  auto *free_count = reinterpret_cast<int16_t *>(pool + 24);
  auto *top = reinterpret_cast<int16_t *>(pool + 26);
  auto *next = reinterpret_cast<int16_t *>(pool + 28);
  auto *lock = reinterpret_cast<pthread_spinlock_t *>(&reinterpret_cast<shm::ShmRegionHead *>(base)->lock);
  pthread_spin_lock(lock);
  ASSERT_GE(*top, 0) << "the listener's inject pool is empty";
  const int16_t index = *top;  // smr_freestack_pop
  *top = next[index];
  --*free_count;
  char *buffer = pool + entry_base + static_cast<uint64_t>(index) * object_size;
  std::memcpy(buffer, sender.c_str(), sender.size() + 1);
  char *cmd = base + head.cmd_queue_offset + sizeof(shm::ShmCirqueHead) + (queue->wcnt & queue->size_mask) * 256;
  std::memset(cmd, 0, 256);
  const int64_t id = 7;
  const uint32_t op = 256;
  const uint64_t size = sender.size() + 1, src = static_cast<uint64_t>(buffer - base), pid = 999999;
  std::memcpy(cmd + 8, &id, 8);
  std::memcpy(cmd + 16, &op, 4);
  std::memcpy(cmd + 24, &size, 8);
  std::memcpy(cmd + 32, &src, 8);
  std::memcpy(cmd + 40, &pid, 8);
  ++queue->wcnt;
  --reinterpret_cast<shm::ShmRegionHead *>(base)->cmd_cnt;
  __atomic_store_n(&reinterpret_cast<shm::ShmRegionHead *>(base)->signal, 1, __ATOMIC_SEQ_CST);
  pthread_spin_unlock(lock);
  munmap(base, head.total_size);
}

// A fabric:shm domain and a listener on 127.0.0.1, any port (addr says which).
struct ShmListener {
  std::unique_ptr<Domain> domain;
  std::unique_ptr<Listener> listener;
  sockaddr_in addr{};

  void open() {
    std::string error;
    ASSERT_EQ(open_domain("fabric:shm", &domain, &error), 0) << error;
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(domain->listen(reinterpret_cast<sockaddr *>(&addr), sizeof addr, 16, &listener), 0);
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    ASSERT_EQ(listener->local_address(&bound, &len), 0);
    addr.sin_port = reinterpret_cast<sockaddr_in &>(bound).sin_port;
  }

  // A client of this process connects and both ends are established;
  // `meanwhile` runs after the client's connect went and before the listener
  // looks for its request.
  void serve_one_client(const std::function<void()> &meanwhile = {}) {
    const uint8_t record[40] = {1};
    std::unique_ptr<Endpoint> client, server;
    std::unique_ptr<ConnectionRequest> request;
    ASSERT_EQ(domain->create_endpoint(nullptr, &client), 0);
    ASSERT_EQ(client->connect(reinterpret_cast<sockaddr *>(&addr), sizeof addr, record, sizeof record), 0);
    if (meanwhile) meanwhile();
    ASSERT_TRUE(test::wait_until(
        [&] {
          CmEvent ev;
          if (client->poll_cm(&ev) == 1) ADD_FAILURE() << "client event " << int(ev.kind) << " " << ev.status;
          return listener->get_request(&request) == 1;
        },
        kWaitMs))
        << "no request: no admission left, or the listener's table is full";
    ASSERT_EQ(domain->create_endpoint(request.get(), &server), 0);
    ASSERT_EQ(domain->accept(server.get(), request.get(), record, sizeof record), 0);
    CmEvent client_event, server_event;
    bool client_up = false, server_up = false;
    ASSERT_TRUE(test::wait_until(
        [&] {
          client_up = client_up || client->poll_cm(&client_event) == 1;
          server_up = server_up || server->poll_cm(&server_event) == 1;
          return client_up && server_up;
        },
        kWaitMs));
    EXPECT_EQ(client_event.kind, CmEventKind::kEstablished) << client_event.status;
    EXPECT_EQ(server_event.kind, CmEventKind::kEstablished) << server_event.status;
  }
};

TEST(ShmNameExchange, ListenerSurvivesTheNameOfAVanishedClientAndServesTheNext) {
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  shm::Rendezvous rv{};
  ASSERT_TRUE(shm::read_rendezvous(shm::rendezvous_name("127.0.0.1", ntohs(shm_listener.addr.sin_port)), &rv));
  for (int i = 0; i < 3; ++i) enqueue_name_exchange(rv.name, "gpusock-ep-999999-1-dead-" + std::to_string(i));
  std::unique_ptr<ConnectionRequest> request;
  EXPECT_EQ(shm_listener.listener->get_request(&request), 0);  // shm 1.17 alone: SIGSEGV in fi_cq_read here
  shm_listener.serve_one_client();
}

// Every free descriptor number of this process taken (the limit lowered to a
// few above what is open, then filled), given back when it goes.
struct DescriptorsTaken {
  rlimit saved{};
  bool lowered = false;
  std::vector<int> fds;
  void take_all() {
    ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
    const int spare = open("/dev/null", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(spare, 0);
    fds.push_back(spare);
    rlimit low = saved;
    low.rlim_cur = static_cast<rlim_t>(spare) + 16;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
    lowered = true;
    int fd;
    while ((fd = fcntl(spare, F_DUPFD_CLOEXEC, 0)) >= 0) fds.push_back(fd);
    ASSERT_EQ(errno, EMFILE);
  }
  ~DescriptorsTaken() {
    for (int fd : fds) close(fd);
    if (lowered) setrlimit(RLIMIT_NOFILE, &saved);
  }
};

// A server out of descriptors while a client's name exchange waits in its
// listener's queue: the kernel keeps such a connection in the backlog. The
// listener may not map the client's region now, so it neither reads its CQ
// (shm would map it and fail) nor drops the exchange (the client would wait
// for good); get_request says EMFILE and the listener reads as ready (as a
// kernel listener with a backlog does); once descriptors are free the client
// is served.
TEST(ShmNameExchange, ListenerOutOfDescriptorsKeepsTheClientWaitingAndServesItLater) {
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  shm_listener.serve_one_client([&] {
    DescriptorsTaken out;
    ASSERT_NO_FATAL_FAILURE(out.take_all());
    std::unique_ptr<ConnectionRequest> request;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < end) {
      // shm 1.17 alone: SIGSEGV in fi_cq_read. The request waits, and says why.
      EXPECT_EQ(shm_listener.listener->get_request(&request), -EMFILE);
      EXPECT_TRUE(shm_listener.listener->maybe_ready());
      usleep(1000);
    }
  });
}

// A client out of descriptors when the listener's new endpoint answers: the
// name exchange ahead of its ACCEPT names a region the client cannot open
// now. The connect fails with EMFILE (shm alone: SIGSEGV in fi_cq_read), and
// once descriptors are free the next client is served.
TEST(ShmNameExchange, ClientOutOfDescriptorsFailsItsConnectWithEmfile) {
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  const uint8_t record[40] = {1};
  std::unique_ptr<Endpoint> client, server;
  std::unique_ptr<ConnectionRequest> request;
  ASSERT_EQ(shm_listener.domain->create_endpoint(nullptr, &client), 0);
  ASSERT_EQ(client->connect(reinterpret_cast<sockaddr *>(&shm_listener.addr), sizeof shm_listener.addr, record,
                            sizeof record),
            0);
  ASSERT_TRUE(test::wait_until(
      [&] {
        CmEvent early;
        if (client->poll_cm(&early) == 1) ADD_FAILURE() << "client event " << int(early.kind) << " " << early.status;
        return shm_listener.listener->get_request(&request) == 1;
      },
      kWaitMs));
  ASSERT_EQ(shm_listener.domain->create_endpoint(request.get(), &server), 0);
  ASSERT_EQ(shm_listener.domain->accept(server.get(), request.get(), record, sizeof record), 0);
  CmEvent event;
  {
    DescriptorsTaken out;
    ASSERT_NO_FATAL_FAILURE(out.take_all());
    ASSERT_TRUE(test::wait_until([&] { return client->poll_cm(&event) == 1; }, kWaitMs));
  }
  EXPECT_EQ(event.kind, CmEventKind::kRejected);
  EXPECT_EQ(event.status, -EMFILE);
  client.reset();
  ASSERT_NO_FATAL_FAILURE(shm_listener.serve_one_client());
}

// Clients of another process that give up after their name exchange went
// and before their REQ did, in rounds of 64 (what a domain keeps parked),
// 256 in all, more than the listener admits at once. Each is parked until
// its exchange is read, then probes the listener, which takes it out of its
// table and frees its admission. A client after them is served.
TEST(ShmNameExchange, ClientsThatGiveUpBeforeTheirRequestLeaveNoPeerBehind) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const auto say = [](int fd) {
    const char c = 1;
    return write(fd, &c, 1) == 1;
  };
  const auto hear = [](int fd) {
    char c;
    return read(fd, &c, 1) == 1;
  };
  constexpr int kRounds = 4, kPerRound = 64;
  const pid_t child = fork();  // before this process opens a domain (no threads)
  ASSERT_GE(child, 0);
  if (child == 0) {
    uint16_t port = 0;
    if (read(to_child[0], &port, sizeof port) != sizeof port) _exit(2);
    std::unique_ptr<Domain> domain;
    std::string error;
    if (open_domain("fabric:shm", &domain, &error) != 0) _exit(3);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = port;
    const uint8_t record[40] = {2};
    for (int round = 0; round < kRounds; ++round) {
      for (int i = 0; i < kPerRound; ++i) {  // the listener reads nothing meanwhile
        std::unique_ptr<Endpoint> quitter;
        if (domain->create_endpoint(nullptr, &quitter) != 0) _exit(4);
        if (quitter->connect(reinterpret_cast<sockaddr *>(&to), sizeof to, record, sizeof record) != 0) _exit(5);
      }
      if (!say(to_parent[1]) || !hear(to_child[0])) _exit(6);  // it read their exchanges
      std::unique_ptr<Endpoint> settle;                        // making one settles the parked: each probes
      if (domain->create_endpoint(nullptr, &settle) != 0) _exit(7);
      if (!say(to_parent[1]) || !hear(to_child[0])) _exit(8);
    }
    _exit(0);
  }
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  const uint16_t port = shm_listener.addr.sin_port;
  ASSERT_EQ(write(to_child[1], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  const auto progress_a_while = [&] {
    std::unique_ptr<ConnectionRequest> request;
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (std::chrono::steady_clock::now() < end) {
      while (shm_listener.listener->get_request(&request) == 1) request.reset();  // a REQ that went after all: refused
      usleep(1000);
    }
  };
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(hear(to_parent[0])) << "round " << round;
    progress_a_while();  // their exchanges
    ASSERT_TRUE(say(to_child[1]));
    ASSERT_TRUE(hear(to_parent[0]));
    progress_a_while();  // their probes
    ASSERT_TRUE(say(to_child[1]));
  }

  shm_listener.serve_one_client();
  int status = 0;
  EXPECT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) close(fd);
}

// shm 1.17 writes zeros from a region's name to the end of its power-of-two
// size; the endpoint gives those pages back, so its region file holds a few
// pages, not megabytes (shm_region.h, release_region_tail).
TEST(ShmRegion, TailPastTheNamesHoldsNoPages) {
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  shm::Rendezvous rv{};
  ASSERT_TRUE(shm::read_rendezvous(shm::rendezvous_name("127.0.0.1", ntohs(shm_listener.addr.sin_port)), &rv));
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm/" + std::string(rv.name)).c_str(), &st), 0);
  EXPECT_GE(st.st_size, 8 << 20) << "a region smaller than shm 1.17's";
  EXPECT_LT(static_cast<long long>(st.st_blocks) * 512, 1 << 20) << "bytes held by a region of " << st.st_size;
  shm_listener.serve_one_client();  // the endpoint still works
}

// The watchdog frees a listener region's lock that a killed client left held
// (shm_watchdog.h), and only that: a busy listener's lock may be seen held at
// every look for seconds while it changes hands. The test holds the lock
// itself and moves the command queue's counters (an empty queue stays empty)
// as enqueues and progress passes would: not released; then holds it still:
// released, and the listener serves the next client.
TEST(ShmListenerLock, HeldWhileCommandsMoveIsKeptAndHeldStillIsReleased) {
  // 2 s instead of 10 (when the process has not read its settings yet).
  setenv("GPUSOCK_SHM_STUCK_LOCK_MS", "2000", 0);
  const auto stuck_ms = gpusock::config::get(gpusock::config::Id::kShmStuckLockMs);
  ShmListener shm_listener;
  ASSERT_NO_FATAL_FAILURE(shm_listener.open());
  shm::Rendezvous rv{};
  ASSERT_TRUE(shm::read_rendezvous(shm::rendezvous_name("127.0.0.1", ntohs(shm_listener.addr.sin_port)), &rv));
  shm::ShmRegionHead head{};
  char *base = static_cast<char *>(shm::map_region(rv.name, &head));
  ASSERT_NE(base, nullptr);
  auto *queue = reinterpret_cast<shm::ShmCirqueHead *>(base + head.cmd_queue_offset);
  int *lock = &reinterpret_cast<shm::ShmRegionHead *>(base)->lock;
  const int free_value = __atomic_load_n(lock, __ATOMIC_ACQUIRE);
  pthread_spin_lock(reinterpret_cast<pthread_spinlock_t *>(lock));
  const auto held = [&] { return __atomic_load_n(lock, __ATOMIC_ACQUIRE) != free_value; };
  const auto moving_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(stuck_ms + 2000);
  while (std::chrono::steady_clock::now() < moving_until && held()) {
    __atomic_fetch_add(&queue->rcnt, 1, __ATOMIC_RELEASE);
    __atomic_fetch_add(&queue->wcnt, 1, __ATOMIC_RELEASE);
    usleep(20000);
  }
  EXPECT_TRUE(held()) << "released while commands moved";
  EXPECT_TRUE(test::wait_until([&] { return !held(); }, kWaitMs)) << "a lock held still was never released";
  munmap(base, head.total_size);
  shm_listener.serve_one_client();
}

}  // namespace
