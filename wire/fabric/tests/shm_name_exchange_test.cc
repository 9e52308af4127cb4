// A fabric:shm listener and name exchanges whose sender's region cannot be
// opened (wire/fabric/shm_name_exchange.h). The test plays the peer at the
// byte level: it enqueues shm 1.17's name exchange into the listener's
// command queue as a client's first send does (libfabric's smr_send_name),
// naming a region that no longer exists, as a client killed and swept before
// the listener progressed leaves it. shm alone dies in fi_cq_read on it.
#include "wire/fabric/shm_names.h"
#include "wire/fabric/shm_region.h"
#include "wire/transport.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>

namespace {

using namespace gpusock::wire;
namespace shm = gpusock::wire::fabric::shm;

bool wait_until(const std::function<bool()> &done, int timeout_ms = 20000) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    usleep(1000);
  }
  return done();
}

// What smr_send_name writes (shm 1.17): a command of 256 bytes whose header
// has op SMR_OP_MAX + ofi_ctrl_connreq, the sender's id for us, its pid, and
// an inject buffer popped from our pool holding its region's name.
void enqueue_name_exchange(const std::string &region, const std::string &sender) {
  const int fd = shm_open(region.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  shm::ShmRegionHead head{};
  ASSERT_EQ(pread(fd, &head, sizeof head, 0), static_cast<ssize_t>(sizeof head));
  char *base = static_cast<char *>(mmap(nullptr, head.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  ASSERT_NE(base, MAP_FAILED);
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

TEST(ShmNameExchange, ListenerSurvivesTheNameOfAVanishedClientAndServesTheNext) {
  std::unique_ptr<Domain> domain;
  std::string error;
  ASSERT_EQ(open_domain("fabric:shm", &domain, &error), 0) << error;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::unique_ptr<Listener> listener;
  ASSERT_EQ(domain->listen(reinterpret_cast<sockaddr *>(&addr), sizeof addr, 16, &listener), 0);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ASSERT_EQ(listener->local_address(&bound, &len), 0);
  addr.sin_port = reinterpret_cast<sockaddr_in &>(bound).sin_port;
  shm::Rendezvous rv{};
  ASSERT_TRUE(shm::read_rendezvous(shm::rendezvous_name("127.0.0.1", ntohs(addr.sin_port)), &rv));

  for (int i = 0; i < 3; ++i) enqueue_name_exchange(rv.name, "gpusock-ep-999999-1-dead-" + std::to_string(i));
  std::unique_ptr<ConnectionRequest> request;
  EXPECT_EQ(listener->get_request(&request), 0);  // shm 1.17 alone: SIGSEGV in fi_cq_read here

  // A real client after them is served.
  std::unique_ptr<Endpoint> client, server;
  ASSERT_EQ(domain->create_endpoint(nullptr, &client), 0);
  const uint8_t record[40] = {1};
  ASSERT_EQ(client->connect(reinterpret_cast<sockaddr *>(&addr), sizeof addr, record, sizeof record), 0);
  ASSERT_TRUE(wait_until([&] {
    CmEvent ev;
    if (client->poll_cm(&ev) == 1) ADD_FAILURE() << "client event " << int(ev.kind) << " " << ev.status;
    return listener->get_request(&request) == 1;
  }));
  ASSERT_EQ(domain->create_endpoint(request.get(), &server), 0);
  ASSERT_EQ(domain->accept(server.get(), request.get(), record, sizeof record), 0);
  CmEvent client_event, server_event;
  bool client_up = false, server_up = false;
  ASSERT_TRUE(wait_until([&] {
    client_up = client_up || client->poll_cm(&client_event) == 1;
    server_up = server_up || server->poll_cm(&server_event) == 1;
    return client_up && server_up;
  }));
  EXPECT_EQ(client_event.kind, CmEventKind::kEstablished) << client_event.status;
  EXPECT_EQ(server_event.kind, CmEventKind::kEstablished) << server_event.status;
  request.reset();
  client.reset();
  server.reset();
  listener.reset();
}

}  // namespace
