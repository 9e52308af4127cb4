// The proxy driven by hand: requests written into its rings as a GPU writes
// them (seq and check, the first line last), answers read from the status
// lines, over the transport GPUSOCK_TRANSPORT names. The device API's own
// tests (gpu/tests) drive the same proxy from emulated and real kernels.
#include <gpusock/proxy.h>

#include "test-support/sockets.h"
#include "test-support/timing.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using namespace gpusock;
using namespace gpusock::channel;

constexpr int kNoAnswer = INT_MIN;

class HandChannel {
 public:
  explicit HandChannel(uint32_t threads = 1) {
    ProxyOptions o;
    o.max_sockets = 8;
    o.spare_buffer_sets = 4;
    o.rbuf_size = o.sbuf_size = 16384;
    o.request_entries = 16;
    o.threads = threads;
    o.quiet = true;
    start_rc_ = Proxy::start(o, memory_.get(), &proxy_);
    if (start_rc_ == 0) ctx_ = proxy_->device_context();
  }
  ~HandChannel() {
    if (proxy_) proxy_->stop();
  }
  int start_rc() const { return start_rc_; }
  const DeviceContext &ctx() const { return ctx_; }
  const Proxy &proxy() const { return *proxy_; }

  // Writes r on its socket's ring as the GPU does: the body, then seq.
  void post(const Request &request) {
    Request r = request;
    const uint32_t ring = proxy_thread_of(r.slot, ctx_.request_rings);
    const uint64_t ticket = ctx_.ticket[ring * kCounterStride]++;
    Request *e = ctx_.requests + size_t(ring) * (ctx_.request_mask + 1) + (ticket & ctx_.request_mask);
    ASSERT_TRUE(test::wait_until(
        [&] {
          const uint64_t consumed = __atomic_load_n(&ctx_.shared[ring].consumed, __ATOMIC_ACQUIRE);
          return ticket - consumed <= ctx_.request_mask;
        },
        5000));
    r.seq = ticket + 1;
    r.check = request_check(reinterpret_cast<const uint64_t *>(&r), request_line1_words(r));
    std::memcpy(reinterpret_cast<uint8_t *>(e) + 8, reinterpret_cast<const uint8_t *>(&r) + 8, sizeof r - 8);
    __atomic_store_n(&e->seq, r.seq, __ATOMIC_RELEASE);
  }

  // A control request on socket (slot, gen) and its answer (kNoAnswer after 5 s).
  // addr_len is what the request says, whatever the address's size.
  int call(uint32_t slot, uint32_t gen, uint32_t op, int32_t arg0 = 0, int32_t arg1 = 0,
           const sockaddr_in *addr = nullptr, uint32_t addr_len = 0, int wait_ms = 5000) {
    Request r{};
    r.op = op;
    r.slot = slot;
    r.gen = gen;
    r.ctrl_seq = ++ctrl_seq_[slot];
    r.arg0 = arg0;
    r.arg1 = arg1;
    r.addr_len = addr_len;
    if (addr) std::memcpy(r.addr, addr, sizeof *addr);
    post(r);
    const SocketStatus &st = ctx_.status[slot];
    const bool answered =
        test::wait_until([&] { return __atomic_load_n(&st.ctrl_done, __ATOMIC_ACQUIRE) == r.ctrl_seq; }, wait_ms);
    return answered ? __atomic_load_n(&st.ctrl_result, __ATOMIC_ACQUIRE) : kNoAnswer;
  }
  // New ring positions of a socket (kOpData), no answer.
  void positions(uint32_t slot, uint32_t gen, uint64_t send_tail, uint64_t recv_read) {
    Request r{};
    r.op = kOpData;
    r.slot = slot;
    r.gen = gen;
    r.send_tail = send_tail;
    r.recv_read = recv_read;
    post(r);
  }
  uint32_t state(uint32_t slot) const { return __atomic_load_n(&ctx_.status[slot].state, __ATOMIC_ACQUIRE); }
  bool wait_state(uint32_t slot, uint32_t bits) const {
    return test::wait_until([&] { return (state(slot) & bits) == bits; }, 10000);
  }

 private:
  std::unique_ptr<MemoryResource> memory_ = host_memory_resource();
  std::unique_ptr<Proxy> proxy_;
  DeviceContext ctx_{};
  int start_rc_ = 0;
  uint32_t ctrl_seq_[64] = {};
};

sockaddr_in loopback_any_port() { return test::test_address(test::free_port()); }

TEST(ProxyRequests, NopIsAnsweredWithItsSequence) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  EXPECT_EQ(ch.call(0, 1, kOpNop), 0);
  EXPECT_EQ(ch.call(0, 1, kOpNop), 0);
  EXPECT_EQ(ch.call(0, 1, 99), -EINVAL);  // an operation it does not know
}

// The proxy names the transport it opened, the one the settings chose.
TEST(ProxyRequests, NamesTheTransportItOpened) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  const std::string name = ch.proxy().transport();
  EXPECT_TRUE(name == "fabric:tcp" || name == "fabric:shm" || name == "verbs") << name;
  EXPECT_NE(ch.proxy().placement().find("transport " + name), std::string::npos) << ch.proxy().placement();
}

TEST(ProxyRequests, BindTakesTheSocketRulesAddressCheck) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  sockaddr_in a = loopback_any_port();
  sockaddr_in bad = a;
  bad.sin_family = AF_UNIX;
  EXPECT_EQ(ch.call(0, 1, kOpBind, 0, 0, &bad, sizeof bad), -EAFNOSUPPORT);
  EXPECT_EQ(ch.call(0, 1, kOpBind, 0, 0, &a, 8), -EINVAL);     // short for AF_INET
  EXPECT_EQ(ch.call(0, 1, kOpBind, 0, 0, &a, 4096), -EINVAL);  // more than a request carries
  EXPECT_EQ(ch.call(0, 1, kOpBind, 0, 0, &a, sizeof a), 0);
  EXPECT_EQ(ch.call(0, 1, kOpBind, 0, 0, &a, sizeof a), -EINVAL);  // bound already
}

TEST(ProxyRequests, StaleAndMisdirectedRequestsAreDropped) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  EXPECT_EQ(ch.call(1, 5, kOpNop, 0, 0, nullptr, 0, 200), kNoAnswer);  // not the slot's next generation
  EXPECT_EQ(ch.call(1, 1, kOpNop), 0);                                 // the next one is served
  Request r{};
  r.op = kOpNop;
  r.slot = 1000;  // no such slot: the ring moves on
  ch.post(r);
  EXPECT_EQ(ch.call(2, 1, kOpNop), 0);
}

TEST(ProxyRequests, ConnectAcceptCarryBytesAndCloseHandsTheSlotBack) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  const sockaddr_in a = loopback_any_port();
  ASSERT_EQ(ch.call(0, 1, kOpBind, 0, 0, &a, sizeof a), 0);
  ASSERT_EQ(ch.call(0, 1, kOpListen, 4), 0);
  EXPECT_TRUE(ch.wait_state(0, kStListening));
  ASSERT_EQ(ch.call(1, 1, kOpConnect, 0, 0, &a, sizeof a), 0);
  const SocketStatus &listener = ch.ctx().status[0];
  ASSERT_TRUE(test::wait_until([&] { return __atomic_load_n(&listener.accept_queued, __ATOMIC_ACQUIRE) == 1; }, 10000));
  ASSERT_EQ(ch.call(2, 1, kOpAccept, 0, 1), 0);
  ASSERT_TRUE(ch.wait_state(1, kStConnected));
  ASSERT_TRUE(ch.wait_state(2, kStConnected));
  const uint32_t client_set = ch.ctx().status[1].buffer, server_set = ch.ctx().status[2].buffer;
  EXPECT_NE(client_set, server_set);

  const char msg[] = "bytes from a hand-written GPU";
  std::memcpy(ch.ctx().sbufs + size_t(client_set) * ch.ctx().sbuf_size, msg, sizeof msg);
  ch.positions(1, 1, sizeof msg, 0);
  const SocketStatus &server = ch.ctx().status[2];
  ASSERT_TRUE(
      test::wait_until([&] { return __atomic_load_n(&server.recv_write, __ATOMIC_ACQUIRE) == sizeof msg; }, 10000));
  EXPECT_EQ(std::memcmp(ch.ctx().rbufs + size_t(server_set) * ch.ctx().rbuf_size, msg, sizeof msg), 0);

  ch.post(Request{.op = kOpClose, .slot = 1, .gen = 1, .send_tail = sizeof msg});
  const SocketStatus &client = ch.ctx().status[1];
  EXPECT_TRUE(test::wait_until([&] { return __atomic_load_n(&client.releases, __ATOMIC_ACQUIRE) == 1; }, 5000));
  EXPECT_TRUE(ch.wait_state(2, kStRecvClosed));  // the server reads EOF
  EXPECT_EQ(ch.call(1, 2, kOpNop), 0);           // the slot's next socket
}

TEST(ProxyRequests, ConnectingToNobodyFailsOnTheStatusLine) {
  HandChannel ch;
  ASSERT_EQ(ch.start_rc(), 0);
  const sockaddr_in nobody = loopback_any_port();
  const int rc = ch.call(0, 1, kOpConnect, 0, 0, &nobody, sizeof nobody);
  if (rc == 0) EXPECT_TRUE(ch.wait_state(0, kStFailed));
  else EXPECT_EQ(rc, -ECONNREFUSED);
}

TEST(ProxyRequests, EachThreadServesItsOwnRing) {
  HandChannel ch(3);
  ASSERT_EQ(ch.start_rc(), 0);
  ASSERT_EQ(ch.ctx().request_rings, 3u);
  for (uint32_t slot = 0; slot < 6; ++slot) EXPECT_EQ(ch.call(slot, 1, kOpNop), 0) << slot;
}

}  // namespace
