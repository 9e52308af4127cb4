// What the waiting tests (transport_wait_test.cc) use to drive endpoints and
// listeners the way a caller of wait_fd/arm_wait does: progress, and sleep on
// the wait fd when arm_wait allows.
#pragma once

#include "test-support/timing.h"
#include "wire/transport.h"

#include <gtest/gtest.h>

#include <poll.h>

#include <cerrno>
#include <memory>
#include <vector>

namespace gpusock::wire::wait_test {

using gpusock::test::Deadline;

constexpr int kSleepMs = 10000;  // a sleep this long is a lost wake-up
constexpr int kQuietMs = 100;    // an idle wait fd stays unreadable this long
constexpr size_t kBufferSize = 1 << 20;
constexpr uint32_t kRecvPosts = 64;

inline bool readable(int fd, int timeout_ms) {
  pollfd pfd{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&pfd, 1, timeout_ms);
  } while (rc < 0 && errno == EINTR);
  return rc > 0;
}

// What one end has seen.
struct Seen {
  std::vector<Completion> completions;
  std::vector<CmEvent> events;
  bool has_event(CmEventKind kind) const {
    for (const CmEvent &e : events) {
      if (e.kind == kind) return true;
    }
    return false;
  }
  bool closed() const {
    return has_event(CmEventKind::kDisconnected) || has_event(CmEventKind::kError) || has_event(CmEventKind::kRejected);
  }
  size_t count(CompletionKind kind, uint64_t token_or_imm) const {
    size_t n = 0;
    for (const Completion &c : completions) {
      const uint64_t key = kind == CompletionKind::kRecvImm ? c.imm : c.token;
      if (c.kind == kind && key == token_or_imm) ++n;
    }
    return n;
  }
  size_t imms() const {
    size_t n = 0;
    for (const Completion &c : completions) n += c.kind == CompletionKind::kRecvImm;
    return n;
  }
  bool failed_completion() const {
    for (const Completion &c : completions) {
      if (c.status != 0) return true;
    }
    return false;
  }
};

// One progress pass: completions (re-posting the receives immediates used)
// and CM events. Returns how many things it produced.
inline int progress(Endpoint *ep, Seen *seen) {
  Completion buf[32];
  int total = 0;
  const int n = ep->poll(buf, 32);
  for (int i = 0; i < n; ++i) {
    seen->completions.push_back(buf[i]);
    if (buf[i].kind == CompletionKind::kRecvImm && buf[i].status == 0) ep->post_recv(1);
  }
  total += n > 0 ? n : 0;
  CmEvent event;
  while (ep->poll_cm(&event) == 1) {
    seen->events.push_back(event);
    ++total;
  }
  return total;
}

// Progress until `done`, sleeping on the wait fd whenever there is nothing to
// do. False when a sleep ran into kSleepMs, or `done` never came.
template <class Done>
bool sleep_until(Endpoint *ep, Seen *seen, Done &&done) {
  Deadline deadline(60);
  while (!deadline.passed()) {
    const int n = progress(ep, seen);
    if (done()) return true;
    if (n > 0) continue;
    if (ep->arm_wait() == 0 && !readable(ep->wait_fd(), kSleepMs)) return false;
  }
  return done();
}

// One progress pass, then sleep if arm_wait allows. False when the sleep ran
// into kSleepMs.
inline bool nap(Endpoint *ep, Seen *seen) {
  if (progress(ep, seen) > 0) return true;
  return ep->arm_wait() != 0 || readable(ep->wait_fd(), kSleepMs);
}

inline bool sleep_for_request(Listener *listener, std::unique_ptr<ConnectionRequest> *request) {
  Deadline deadline(60);
  while (!deadline.passed()) {
    if (listener->get_request(request) == 1) return true;
    if (listener->arm_wait() == 0 && !readable(listener->wait_fd(), kSleepMs)) return false;
  }
  return false;
}

// Progress until arm_wait says sleeping is safe.
inline bool settle(Endpoint *ep, Seen *seen) {
  Deadline deadline(10);
  while (!deadline.passed()) {
    progress(ep, seen);
    if (ep->arm_wait() == 0) return true;
  }
  return false;
}

inline bool settle(Listener *listener) {
  Deadline deadline(10);
  std::unique_ptr<ConnectionRequest> request;
  while (!deadline.passed()) {
    if (listener->get_request(&request) == 1) return false;  // nobody should be connecting
    if (listener->arm_wait() == 0) return true;
  }
  return false;
}

// Once its wait fd said so, something is pending: arm_wait must not let the
// caller sleep, and maybe_ready must say so.
template <class T>
void expect_pending(T *waiter, const char *what) {
  int rc = waiter->arm_wait();
  if (rc == 0) {
    ASSERT_TRUE(readable(waiter->wait_fd(), kSleepMs)) << what << ": the wait fd never became readable";
    rc = waiter->arm_wait();
  }
  EXPECT_EQ(rc, -EAGAIN) << what;
  EXPECT_TRUE(waiter->maybe_ready()) << what;
}

}  // namespace gpusock::wire::wait_test
