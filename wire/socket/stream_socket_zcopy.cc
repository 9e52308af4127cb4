// Zero-copy sends: a blocking send of at least GPUSOCK_ZCOPY_MIN bytes from
// one buffer RDMA-writes the caller's bytes straight into the peer's receive
// ring, through a cached registration of the buffer (reg_cache.h), instead
// of copying them into the send ring first. The writes, their immediates and
// their cuts are those the send ring would have made; only their local source
// differs. The send returns once the transport has finished with every byte,
// so the caller may reuse the buffer at once, as after any send.
#include "wire/socket/reg_cache.h"
#include "wire/socket/stream_socket.h"

namespace gpusock::socket {

using namespace gpusock::wire;

namespace {
// How long a failed connection's writes may take to come back before the
// transport is cut so that it lets go of the caller's buffer.
constexpr int kRetireAfterErrorMs = 1000;
constexpr int kRetirePollMs = 100;
}  // namespace

bool StreamSocket::send_zero_copy_locked(std::unique_lock<std::mutex> &lock, const iovec &iov, ssize_t *result) {
  if (context_.zcopy_min() == 0 || iov.iov_len < context_.zcopy_min() || zero_copy_active_ ||
      conn_.core().send_status() < 0)
    return false;
  RegCache *cache = context_.reg_cache();
  RegCache::Entry *entry = cache ? cache->acquire(iov.iov_base, iov.iov_len) : nullptr;
  if (entry == nullptr) return false;
  zero_copy_active_ = true;
  Stream &core = conn_.core();
  // What the send ring holds goes first, so no write mixes ring and buffer.
  int rc = wait_for_locked(
      lock, [&] { return core.send_unposted() == 0 || core.send_status() < 0; }, -1);
  const auto *base = static_cast<const uint8_t *>(iov.iov_base);
  const uint64_t begin = core.send_committed();
  conn_.set_send_source(begin, base, iov.iov_len, &RegCache::region(entry));
  size_t done = 0;
  while (rc == 0 && done < iov.iov_len) {
    if ((rc = core.send_status()) < 0) break;
    uint32_t offset;
    const uint32_t space = core.send_space(&offset);
    if (space == 0) {
      rc = wait_for_locked(
          lock, [&] { return core.send_free() > 0 || core.send_status() < 0; }, -1);
      continue;
    }
    const size_t n = std::min<size_t>(space, iov.iov_len - done);
    core.send_commit(static_cast<uint32_t>(n));  // counted in the ring, never copied into it
    done += n;
    conn_.post_actions();
  }
  if (core.send_unposted() > 0) context_.kick();
  const int retired = wait_zero_copy_retired_locked(lock, begin + done);
  conn_.clear_send_source();
  zero_copy_active_ = false;
  cache->release(entry);
  wake_sleepers_locked();  // senders waiting for their turn
  if (retired < 0 && rc == 0) rc = retired;
  *result = done > 0 ? static_cast<ssize_t>(done) : (rc < 0 ? rc : 0);
  return true;
}

// Waits until no write from the caller's buffer can still be read by the
// transport: all acknowledged, or, on a connection that failed, every write
// that was posted (the rest will never be), or the transport gone. A signal
// does not end this wait (the buffer is not the caller's yet); a transport
// that does not give its writes back in time is cut.
int StreamSocket::wait_zero_copy_retired_locked(std::unique_lock<std::mutex> &lock, uint64_t end) {
  Stream &core = conn_.core();
  const auto retired = [&] {
    if (conn_.endpoint() == nullptr || core.send_acked() >= end) return true;
    return core.state() != StreamState::kConnected && core.send_acked() >= core.send_posted();
  };
  auto give_up = Clock::time_point::max();
  for (;;) {
    if (wait_for_locked(lock, retired, kRetirePollMs) == 0) return core.send_acked() >= end ? 0 : core.send_status();
    // -EINTR or -EAGAIN: keep waiting, unless the connection failed long enough ago.
    if (core.state() != StreamState::kError && !core.transport_closed()) continue;
    const auto now = Clock::now();
    if (give_up == Clock::time_point::max()) give_up = now + std::chrono::milliseconds(kRetireAfterErrorMs);
    if (now >= give_up) {
      conn_.abort();
      return -ECONNRESET;
    }
  }
}

}  // namespace gpusock::socket
