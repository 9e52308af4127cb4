// Endpoints opened ahead (wire/fabric/shm_spares.h): a process that keeps
// opening fabric:shm endpoints takes them from its domain's stock; a
// connection made of two of them carries data; a forked child takes none of
// its parent's; nothing of the stock is left in /dev/shm.
#include "test-support/timing.h"
#include "wire/fabric/fabric_rdm.h"
#include "wire/transport.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

using namespace gpusock::wire;
using gpusock::wire::fabric::rdm::RdmDomain;
using gpusock::wire::fabric::rdm::SpareEndpoints;
namespace test = gpusock::test;

constexpr int kWaitMs = 20000;

struct Stocked {
  std::unique_ptr<Domain> domain;
  RdmDomain *rdm = nullptr;

  // A domain whose stock has started (kStartAfter endpoints opened) and filled.
  void open() {
    std::string error;
    ASSERT_EQ(open_domain("fabric:shm", &domain, &error), 0) << error;
    rdm = dynamic_cast<RdmDomain *>(domain.get());
    ASSERT_NE(rdm, nullptr);
    for (uint32_t i = 0; i < SpareEndpoints::kStartAfter; ++i) {
      std::unique_ptr<Endpoint> endpoint;
      ASSERT_EQ(domain->create_endpoint(nullptr, &endpoint), 0);
    }
    ASSERT_TRUE(test::wait_until([&] { return rdm->spares().counts().opened >= 2; }, kWaitMs));
  }
};

std::vector<std::string> files_of(pid_t pid) {
  const std::string mine = "gpusock-ep-" + std::to_string(pid) + "-";
  std::vector<std::string> found;
  DIR *dir = opendir("/dev/shm");
  if (dir == nullptr) return found;
  while (dirent *e = readdir(dir)) {
    if (std::string(e->d_name).rfind(mine, 0) == 0) found.push_back(e->d_name);
  }
  closedir(dir);
  return found;
}

TEST(ShmSpares, ConnectionOfSparesCarriesDataAndTheStockLeavesNoFiles) {
  Stocked stocked;
  ASSERT_NO_FATAL_FAILURE(stocked.open());
  Domain &domain = *stocked.domain;
  {
    std::unique_ptr<Listener> listener;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(domain.listen(reinterpret_cast<sockaddr *>(&addr), sizeof addr, 8, &listener), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(listener->local_address(reinterpret_cast<sockaddr_storage *>(&addr), &len), 0);

    const uint64_t taken_before = stocked.rdm->spares().counts().taken;
    std::unique_ptr<Endpoint> client, server;
    ASSERT_EQ(domain.create_endpoint(nullptr, &client), 0);
    ASSERT_EQ(client->connect(reinterpret_cast<sockaddr *>(&addr), sizeof addr, nullptr, 0), 0);
    std::unique_ptr<ConnectionRequest> request;
    ASSERT_TRUE(test::wait_until(
        [&] {
          CmEvent ev;
          client->poll_cm(&ev);
          return listener->get_request(&request) == 1;
        },
        kWaitMs));
    ASSERT_EQ(domain.create_endpoint(request.get(), &server), 0);
    ASSERT_EQ(domain.accept(server.get(), request.get(), nullptr, 0), 0);
    int up = 0;
    ASSERT_TRUE(test::wait_until(
        [&] {
          CmEvent ev;
          up += client->poll_cm(&ev) + server->poll_cm(&ev);
          return up == 2;
        },
        kWaitMs));
    EXPECT_EQ(stocked.rdm->spares().counts().taken, taken_before + 2) << "both ends came from the stock";

    std::vector<uint8_t> source(4096), target(4096, 0);
    for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<uint8_t>(i * 7 + 3);
    MemoryRegion from, to;
    ASSERT_EQ(domain.register_memory(source.data(), source.size(), kAccessLocal, &from), 0);
    ASSERT_EQ(domain.register_memory(target.data(), target.size(), kAccessRemoteWrite, &to), 0);
    ASSERT_EQ(server->post_recv(4), 0);
    WriteRequest w;
    w.local = source.data();
    w.region = &from;
    w.length = static_cast<uint32_t>(source.size());
    w.remote_addr = to.remote_addr;
    w.rkey = to.rkey;
    w.imm = 0x5a5a;
    ASSERT_EQ(client->post_write(w), 0);
    Completion got{};
    ASSERT_TRUE(test::wait_until(
        [&] {
          Completion c;
          (void)client->poll(&c, 1);
          return server->poll(&got, 1) == 1;
        },
        kWaitMs));
    EXPECT_EQ(got.kind, CompletionKind::kRecvImm);
    EXPECT_EQ(got.imm, 0x5a5au);
    EXPECT_EQ(target, source);
    domain.deregister_memory(&from);
    domain.deregister_memory(&to);
  }
  stocked.domain.reset();
  EXPECT_EQ(files_of(getpid()), std::vector<std::string>{}) << "left in /dev/shm";
}

// The stock's regions are the parent's: a forked child takes none, and opens
// its own endpoints.
TEST(ShmSpares, ForkedChildTakesNoneOfItsParents) {
  Stocked stocked;
  ASSERT_NO_FATAL_FAILURE(stocked.open());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (stocked.rdm->spares().take() != nullptr) _exit(1);
    std::shared_ptr<gpusock::wire::fabric::rdm::RdmShared> own;
    if (stocked.rdm->open_shared(&own) != 0) _exit(2);
    const bool its_own = own->name.rfind("gpusock-ep-" + std::to_string(getpid()) + "-", 0) == 0;
    gpusock::wire::fabric::rdm::retire_shared(own, -1);
    own.reset();  // unlinks its region
    _exit(its_own ? 0 : 3);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_GE(stocked.rdm->spares().counts().opened, 2u);
}

}  // namespace
