// A memcached connection for the CPU programs: gets and sets of many keys
// pipelined on one connection (one round trip for a whole batch), with the
// failure policy every server shares:
//   - any error, timeout or unexpected byte closes the connection (after a
//     protocol surprise the stream cannot be trusted);
//   - a batch that fails on a connection that had worked before (memcached
//     restarted, the connection went stale) is retried once on a new one;
//   - a batch that fails on a fresh connection, or a connect that fails,
//     reports the error: the caller answers "database" errors.
#ifndef FV_MC_CLIENT_H
#define FV_MC_CLIENT_H

#include "fv_memcached.h"
#include "fv_net.h"
#include "fv_record.h"

#include <vector>

namespace fv {

struct McKey {
  char text[kMaxKeyBytes];
  uint32_t len = 0;
};

inline McKey make_key(uint32_t width, uint32_t height, uint32_t identity) {
  McKey k;
  k.len = static_cast<uint32_t>(format_key(k.text, width, height, identity));
  return k;
}

template <class Io>
class McClient {
 public:
  McClient(const sockaddr_in &addr, int timeout_ms) : addr_(addr), timeout_ms_(timeout_ms) {}
  ~McClient() { drop(); }
  McClient(const McClient &) = delete;
  McClient &operator=(const McClient &) = delete;

  // Gets keys[0..n): on_reply(i, status (kMcHit/kMcMiss), data, len) in
  // order. After a retry on a new connection on_reply may see an index again.
  // between() runs once, while memcached works on the first attempt's gets
  // (the caller's compute overlaps the round trip).
  // Returns 0 or a negated errno (memcached unusable: no reply is complete).
  template <class F, class B>
  int get_many(const McKey *keys, size_t n, F &&on_reply, B &&between) {
    bool between_done = false;
    auto run_between = [&] {
      if (!between_done) between();
      between_done = true;
    };
    const int rc = with_retry([&] {
      tx_.clear();
      for (size_t i = 0; i < n; ++i) {
        char line[kMcMaxGetBytes];
        append(line, mc_format_get(line, keys[i].text, keys[i].len));
      }
      return exchange(n, run_between, [&](size_t i, const uint8_t *p, size_t have) {
        const McReply r = mc_parse_get(p, have, keys[i].text, keys[i].len, kMaxRecordBytes);
        if (r.status == kMcHit || r.status == kMcMiss) on_reply(i, r.status, p + r.data_offset, r.data_len);
        return r;
      });
    });
    run_between();  // also when no attempt got as far as sending
    return rc;
  }

  // Sets keys[i] = values(i) (a pair of pointer and length) for i in [0, n).
  template <class V>
  int set_many(const McKey *keys, size_t n, V &&values) {
    return with_retry([&] {
      tx_.clear();
      for (size_t i = 0; i < n; ++i) {
        const auto [data, len] = values(i);
        char line[kMcMaxLine];
        append(line, mc_format_set_line(line, keys[i].text, keys[i].len, len));
        append(data, len);
        append("\r\n", 2);
      }
      return exchange(
          n, [] {}, [](size_t, const uint8_t *p, size_t have) { return mc_parse_stored(p, have); });
    });
  }

  bool connected() const { return fd_ >= 0; }

 private:
  template <class Attempt>
  int with_retry(Attempt &&attempt) {
    for (;;) {
      const bool fresh = fd_ < 0;
      if (fresh) {
        fd_ = connect_nonblocking<Io>(addr_, timeout_ms_);
        if (fd_ < 0) return fd_;
      }
      const int rc = attempt();
      if (rc == 0) return 0;
      drop();
      if (fresh) return rc;
    }
  }

  void append(const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    tx_.insert(tx_.end(), b, b + n);
  }

  // Sends tx_, runs sent(), then parses n replies with parse(i, bytes, have) -> McReply.
  template <class Sent, class Parse>
  int exchange(size_t n, Sent &&sent, Parse &&parse) {
    const int rc = send_all<Io>(fd_, tx_.data(), tx_.size(), timeout_ms_);
    sent();
    if (rc < 0) return rc;
    size_t have = 0, pos = 0;
    for (size_t i = 0; i < n;) {
      const McReply r = have > pos ? parse(i, rx_.data() + pos, have - pos) : McReply{kMcNeedMore, 0, 0, 0};
      if (r.status == kMcError) return -EPROTO;
      if (r.status != kMcNeedMore) {
        pos += r.total;
        ++i;
        continue;
      }
      const size_t want = (r.total ? pos + r.total : have + 64 * 1024);
      if (rx_.size() < want) rx_.resize(want);
      const long k = recv_some<Io>(fd_, rx_.data() + have, rx_.size() - have, timeout_ms_);
      if (k <= 0) return k == 0 ? -ECONNRESET : static_cast<int>(k);
      have += static_cast<size_t>(k);
    }
    return have == pos ? 0 : -EPROTO;  // bytes nobody asked for
  }

  void drop() {
    if (fd_ >= 0) Io::close(fd_);
    fd_ = -1;
  }

  sockaddr_in addr_;
  int timeout_ms_;
  int fd_ = -1;
  std::vector<uint8_t> tx_, rx_;
};

}  // namespace fv

#endif
