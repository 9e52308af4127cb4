// Face verification load generator: C connections, each a thread with a
// blocking socket (plain sockets, no SOCK_NONBLOCK, no epoll: it runs under
// gpusock's shim and under rdma-core's librspreload), in a closed loop (one
// request in flight per connection) or an open loop (--rate: requests sent
// on a schedule whatever the replies do; latency from the scheduled time).
// --mux T multiplexes the connections instead, as event-driven clients do: T
// threads, each an epoll loop over its share of non-blocking connections, one
// request in flight on each (closed loop), so hundreds of connections need no
// more threads than cores. --ports K spreads the connections over K
// consecutive server ports (a GPU-native server with K proxies). Every reply
// is checked against the CPU reference (fv_lbp.h on the same generated
// images): the verdict and the exact chi-square. The client's own CPU use
// (cores busy, of the cores it may run on) is reported with each run, so a
// run whose load generator ran out of cores shows it.
//
//   fv_client --server 127.0.0.1:7000 [--conns 4] [--ports 1] [--requests N | --duration S]
//             [--rate R | --mux T] [--warmup S] [--size 128 | --width W --height H]
//             [--identities 10000] [--seed 1] [--match-pct 50] [--unknown-pct 10]
//             [--grid 8] [--threshold-q16 T] [--pool 1024] [--timeout-ms 10000]
//             [--allow-db-errors | --expect-db-errors] [--label L] [--json FILE]
// Exit status 0 when every reply was right.
#include "fv_client_report.h"
#include "fv_dataset.h"
#include "fv_net.h"
#include "fv_record.h"

#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#include <atomic>
#include <deque>
#include <thread>

namespace fv {
namespace {

struct Options {
  sockaddr_in server{};
  std::string server_text = "127.0.0.1:7000";
  int conns = 4, ports = 1;  // connection c goes to the server's port + c % ports
  int mux = 0;               // threads multiplexing the connections; 0: a thread per connection
  uint64_t requests = 0;     // closed loop: total; 0 = by duration
  double duration = 0, warmup = 0, rate = 0;
  uint32_t width = 128, height = 128, grid = kDefaultGrid, threshold_q16 = kDefaultThresholdQ16, pool = 1024;
  DatasetParams data;
  int timeout_ms = 10000;
  Expect expect = Expect::kExact;
  std::string label = "fv", json;
};

struct PoolEntry {
  std::vector<uint8_t> request;  // header (request id patched per send) + image
  Reply expect;
};

// The distinct requests and their reference replies, built on all cores.
std::vector<PoolEntry> build_pool(const Options &o) {
  std::vector<PoolEntry> pool(o.pool);
  const Features f{o.width, o.height, o.grid};
  std::atomic<uint32_t> next{0};
  auto work = [&] {
    uint8_t table[256];
    build_uniform_table(table);
    std::vector<uint8_t> base(size_t(o.width) * o.height), record(record_bytes(o.grid));
    std::vector<uint32_t> probe(f.bins()), ref(f.bins());
    for (uint32_t i; (i = next++) < o.pool;) {
      const RequestPlan plan = request_plan(o.data, i);
      PoolEntry &e = pool[i];
      e.request.resize(kRequestHeaderBytes + base.size());
      encode_request_header(RequestHeader{kRequestMagic, kVersion, 0, 0, plan.claimed, static_cast<uint16_t>(o.width),
                                          static_cast<uint16_t>(o.height)},
                            e.request.data());
      uint8_t *img = e.request.data() + kRequestHeaderBytes;
      probe_image(o.data.seed, plan.source, plan.variant, o.width, o.height, img);
      if (plan.kind == RequestKind::kUnknown) {
        e.expect = Reply{kUnknownIdentity, kReasonNone, 0, 0, 0};
        continue;
      }
      lbp_histogram(img, f, table, probe.data());
      base_image(o.data.seed, plan.claimed, o.width, o.height, base.data());
      lbp_histogram(base.data(), f, table, ref.data());
      encode_record(f, ref.data(), record.data());
      e.expect = verdict_reply(0, f, chi2_q16(probe.data(), record.data(), f.bins()), o.threshold_q16);
    }
  };
  std::vector<std::thread> threads;
  const unsigned n = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (unsigned t = 0; t < n; ++t) threads.emplace_back(work);
  for (auto &t : threads) t.join();
  return pool;
}

class Run {
 public:
  Run(const Options &o, std::vector<PoolEntry> pool) : o_(o), pool_(std::move(pool)) {}

  Tally go() {
    const int workers = o_.mux > 0 ? o_.mux : o_.conns;
    std::vector<Tally> per(workers);
    std::vector<std::thread> threads;
    const double cpu0 = process_cpu_seconds();
    start_ = now_ns();
    measure_from_ = start_ + uint64_t(o_.warmup * 1e9);
    end_ = o_.duration > 0 ? measure_from_ + uint64_t(o_.duration * 1e9) : ~0ull;
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([this, w, &per] {
        if (o_.mux > 0) mux_loop(w, &per[w]);
        else if (o_.rate > 0) open_loop(w, &per[w]);
        else closed_loop(w, &per[w]);
      });
    for (auto &t : threads) t.join();
    Tally all;
    const uint64_t stop = now_ns();
    all.seconds = double(std::min(stop, end_) - measure_from_) / 1e9;
    all.client_cores_busy = (process_cpu_seconds() - cpu0) / (double(stop - start_) / 1e9);
    all.client_cores = usable_cores();
    for (Tally &t : per) all.merge(std::move(t));
    return all;
  }

 private:
  int connect_server(int c, Tally *t) {
    sockaddr_in addr = o_.server;
    addr.sin_port = htons(static_cast<uint16_t>(ntohs(addr.sin_port) + c % o_.ports));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    if (fd < 0 || connect(fd, (const sockaddr *)&addr, sizeof addr) < 0) {
      t->fail(std::string("connect ") + o_.server_text + " (+" + std::to_string(c % o_.ports) +
              "): " + strerror(errno));
      if (fd >= 0) close(fd);
      return -1;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  // Sends request k (pool entry k % pool, request id k).
  bool send_request(int fd, uint64_t k, std::vector<uint8_t> *buf, Tally *t) {
    const PoolEntry &e = pool_[k % pool_.size()];
    *buf = e.request;
    store_le(buf->data() + 8, k, 8);
    const int rc = send_all<LibcIo>(fd, buf->data(), buf->size(), o_.timeout_ms);
    if (rc < 0) t->fail(std::string("send: ") + strerror(-rc));
    return rc == 0;
  }

  void record(uint64_t k, const uint8_t *bytes, uint64_t since, Tally *t) {
    const uint64_t now = now_ns();
    Reply expect = pool_[k % pool_.size()].expect;
    expect.request_id = k;
    t->check(bytes, expect, o_.expect, now >= measure_from_ && now <= end_ ? now - since : ~0ull);
  }

  bool more(uint64_t k) const { return (o_.requests == 0 || k < o_.requests) && now_ns() < end_; }

  void closed_loop(int c, Tally *t) {
    const int fd = connect_server(c, t);
    if (fd < 0) return;
    std::vector<uint8_t> buf;
    uint8_t reply[kReplyBytes];
    for (uint64_t k; more(k = next_++);) {
      const uint64_t sent = now_ns();
      if (!send_request(fd, k, &buf, t) || !recv_exact(fd, reply, sizeof reply, t)) break;
      record(k, reply, sent, t);
    }
    close(fd);
  }

  void open_loop(int c, Tally *t) {
    const int fd = connect_server(c, t);
    if (fd < 0) return;
    const uint64_t interval = uint64_t(1e9 * o_.conns / o_.rate);
    uint64_t due = start_ + uint64_t(1e9 * c / o_.rate);
    std::deque<std::pair<uint64_t, uint64_t>> outstanding;  // request id, scheduled time
    std::vector<uint8_t> buf;
    uint8_t rx[kReplyBytes * 64];
    size_t have = 0;
    bool sending = true;
    uint64_t last_progress = now_ns();
    while (sending || !outstanding.empty()) {
      uint64_t now = now_ns();
      if (sending && now >= due) {
        const uint64_t k = next_++;
        if (!more(k)) {
          sending = false;
          continue;
        }
        if (!send_request(fd, k, &buf, t)) break;
        outstanding.emplace_back(k, due);
        due += interval;
        continue;
      }
      const int wait_ms = sending ? int((due - now) / 1000000) : 100;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, wait_ms) <= 0) {
        if (!sending && now_ns() - last_progress > uint64_t(o_.timeout_ms) * 1000000) {
          t->fail("no reply within --timeout-ms");
          break;
        }
        continue;
      }
      const long k = recv(fd, rx + have, sizeof rx - have, 0);
      if (k <= 0) {
        t->fail(k == 0 ? "server closed the connection" : std::string("recv: ") + strerror(errno));
        break;
      }
      have += static_cast<size_t>(k);
      last_progress = now_ns();
      size_t pos = 0;
      for (; have - pos >= kReplyBytes; pos += kReplyBytes) {
        const uint64_t id = load_le(rx + pos + 8, 8);
        auto it = outstanding.begin();
        while (it != outstanding.end() && it->first != id) ++it;
        if (it == outstanding.end()) {
          t->fail("a reply to no outstanding request");
          break;
        }
        record(id, rx + pos, it->second, t);
        outstanding.erase(it);
      }
      memmove(rx, rx + pos, have - pos);
      have -= pos;
      if (t->failed) break;
    }
    close(fd);
  }

  // One connection of a multiplexing thread: the request being sent (out,
  // from out_pos) or the reply being read (in).
  struct MuxConn {
    int fd = -1;
    uint64_t k = 0, sent = 0;
    std::vector<uint8_t> out;
    size_t out_pos = 0, in_have = 0;
    bool watching_out = false;  // EPOLLOUT is in its epoll registration
    uint8_t in[kReplyBytes] = {};
  };

  // Thread w's connections (c % mux == w), each with one request in flight,
  // driven by one epoll set: level-triggered EPOLLIN, and EPOLLOUT while a
  // request did not fit in the socket at once.
  void mux_loop(int w, Tally *t) {
    std::vector<MuxConn> conns;
    for (int c = w; c < o_.conns; c += o_.mux) {
      MuxConn m;
      if ((m.fd = connect_server(c, t)) < 0) break;
      conns.push_back(std::move(m));
    }
    const int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) t->fail(std::string("epoll_create1: ") + strerror(errno));
    size_t active = 0;
    for (MuxConn &m : conns) {
      if (t->failed) break;
      LibcIo::set_nonblocking(m.fd);
      epoll_event ev{EPOLLIN, {.ptr = &m}};
      if (epoll_ctl(ep, EPOLL_CTL_ADD, m.fd, &ev) < 0) t->fail(std::string("epoll_ctl: ") + strerror(errno));
      else if (mux_start(ep, &m, t)) ++active;
    }
    epoll_event events[64];
    while (active > 0 && !t->failed) {
      const int n = epoll_wait(ep, events, 64, o_.timeout_ms);
      if (n == 0) t->fail("no reply within --timeout-ms");
      if (n < 0 && errno != EINTR) t->fail(std::string("epoll_wait: ") + strerror(errno));
      for (int i = 0; i < n && !t->failed; ++i) {
        MuxConn &m = *static_cast<MuxConn *>(events[i].data.ptr);
        const int done = mux_progress(ep, &m, events[i].events, t);
        if (done > 0 && !mux_start(ep, &m, t)) --active;
      }
    }
    for (MuxConn &m : conns) close(m.fd);
    if (ep >= 0) close(ep);
  }

  // The next request on m; false when there is none (the run is over) or the
  // send failed.
  bool mux_start(int ep, MuxConn *m, Tally *t) {
    const uint64_t k = next_++;
    if (!more(k)) return false;
    m->k = k;
    m->out = pool_[k % pool_.size()].request;
    store_le(m->out.data() + 8, k, 8);
    m->out_pos = m->in_have = 0;
    m->sent = now_ns();
    return mux_progress(ep, m, 0, t) >= 0;
  }

  // Sends what the socket takes and reads what arrived: 1 when the reply is
  // complete (and recorded), 0 when more is to come, -1 on a failure.
  int mux_progress(int ep, MuxConn *m, uint32_t events, Tally *t) {
    if (m->out_pos < m->out.size()) {
      const long k = send(m->fd, m->out.data() + m->out_pos, m->out.size() - m->out_pos, MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN && errno != EINTR) {
        t->fail(std::string("send: ") + strerror(errno));
        return -1;
      }
      if (k > 0) m->out_pos += size_t(k);
    }
    const bool sending = m->out_pos < m->out.size();
    if (sending != m->watching_out) {
      epoll_event ev{EPOLLIN | (sending ? EPOLLOUT : 0u), {.ptr = m}};
      if (epoll_ctl(ep, EPOLL_CTL_MOD, m->fd, &ev) < 0) {
        t->fail(std::string("epoll_ctl: ") + strerror(errno));
        return -1;
      }
      m->watching_out = sending;
    }
    if (sending) return 0;
    if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR))) return 0;
    const long k = recv(m->fd, m->in + m->in_have, kReplyBytes - m->in_have, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    if (k <= 0) {
      t->fail(k == 0 ? "server closed the connection" : std::string("recv: ") + strerror(errno));
      return -1;
    }
    if ((m->in_have += size_t(k)) < kReplyBytes) return 0;
    record(m->k, m->in, m->sent, t);
    return 1;
  }

  static double process_cpu_seconds() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }

  static int usable_cores() {
    cpu_set_t set;
    return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  }

  bool recv_exact(int fd, uint8_t *p, size_t n, Tally *t) {
    for (size_t got = 0; got < n;) {
      pollfd pf{fd, POLLIN, 0};
      if (poll(&pf, 1, o_.timeout_ms) <= 0) {
        t->fail("no reply within --timeout-ms");
        return false;
      }
      const long k = recv(fd, p + got, n - got, 0);
      if (k <= 0) {
        t->fail(k == 0 ? "server closed the connection" : std::string("recv: ") + strerror(errno));
        return false;
      }
      got += static_cast<size_t>(k);
    }
    return true;
  }

  const Options &o_;
  std::vector<PoolEntry> pool_;
  std::atomic<uint64_t> next_{0};
  uint64_t start_ = 0, measure_from_ = 0, end_ = 0;
};

bool parse_options(int argc, char **argv, Options *o) {
  Flags f{argc, argv};
  while (!f.done()) {
    const std::string n = f.name();
    if (n == "--server") o->server_text = f.next();
    else if (n == "--conns") o->conns = static_cast<int>(f.number());
    else if (n == "--ports") o->ports = static_cast<int>(f.number());
    else if (n == "--requests") o->requests = static_cast<uint64_t>(f.number());
    else if (n == "--duration") o->duration = atof(f.next());
    else if (n == "--warmup") o->warmup = atof(f.next());
    else if (n == "--rate") o->rate = atof(f.next());
    else if (n == "--mux") o->mux = static_cast<int>(f.number());
    else if (n == "--size") o->width = o->height = static_cast<uint32_t>(f.number());
    else if (n == "--width") o->width = static_cast<uint32_t>(f.number());
    else if (n == "--height") o->height = static_cast<uint32_t>(f.number());
    else if (n == "--identities") o->data.identities = static_cast<uint32_t>(f.number());
    else if (n == "--seed") o->data.seed = static_cast<uint64_t>(f.number());
    else if (n == "--match-pct") o->data.match_pct = static_cast<uint32_t>(f.number());
    else if (n == "--unknown-pct") o->data.unknown_pct = static_cast<uint32_t>(f.number());
    else if (n == "--grid") o->grid = static_cast<uint32_t>(f.number());
    else if (n == "--threshold-q16") o->threshold_q16 = static_cast<uint32_t>(f.number());
    else if (n == "--pool") o->pool = static_cast<uint32_t>(f.number());
    else if (n == "--timeout-ms") o->timeout_ms = static_cast<int>(f.number());
    else if (n == "--allow-db-errors") o->expect = Expect::kAllowDatabaseErrors;
    else if (n == "--expect-db-errors") o->expect = Expect::kDatabaseErrors;
    else if (n == "--label") o->label = f.next();
    else if (n == "--json") o->json = f.next();
    else return false;
  }
  const RequestHeader h{
      kRequestMagic, kVersion, 0, 0, 0, static_cast<uint16_t>(o->width), static_cast<uint16_t>(o->height)};
  return parse_endpoint(o->server_text, &o->server) && o->conns > 0 && o->ports > 0 && o->pool > 0 && o->grid >= 1 &&
         o->mux >= 0 && o->mux <= o->conns && !(o->mux > 0 && o->rate > 0) && o->grid <= kMaxGrid &&
         o->width <= kMaxDim && o->height <= kMaxDim && validate_request(h, o->grid) == kReasonNone &&
         (o->requests > 0 || o->duration > 0) && o->data.match_pct + o->data.unknown_pct <= 100;
}

}  // namespace
}  // namespace fv

int main(int argc, char **argv) {
  using namespace fv;
  Options o;
  if (!parse_options(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s --server A.B.C.D:PORT [--conns C] [--ports K] (--requests N | --duration S) "
                 "[--rate R | --mux T (<= C)] [--warmup S]\n"
                 "       [--size S | --width W --height H] [--identities N] [--seed S] [--match-pct P]\n"
                 "       [--unknown-pct P] [--grid G] [--threshold-q16 T] [--pool P] [--timeout-ms MS]\n"
                 "       [--allow-db-errors | --expect-db-errors] [--label L] [--json FILE]\n",
                 argv[0]);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  Run run(o, build_pool(o));
  Tally t = run.go();
  const RunInfo info{o.label, o.rate > 0 ? "open" : o.mux > 0 ? "closed-mux" : "closed", o.conns, o.rate, o.width,
                     o.height};
  t.print_summary(info);
  if (!o.json.empty() && !t.write_json(o.json, info)) {
    std::fprintf(stderr, "fv_client: cannot write %s\n", o.json.c_str());
    return 1;
  }
  return t.ok(o.requests) ? 0 : 1;
}
