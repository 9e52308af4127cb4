// Face verification, CPU server: the same algorithm in plain loops the
// compiler vectorizes (-O3), N worker threads with epoll, plain sockets (libc
// only). Run it under gpusock's LD_PRELOAD shim to serve over gpusock, or as
// is over kernel TCP.
//
//   fv_cpu_server [--workers 4] [--port 7000] [--memcached 127.0.0.1:11211]
//                 [--grid 8] [--threshold-q16 T] [--mc-timeout-ms 1000]
//
// An acceptor thread hands connections to the workers round robin (through a
// pipe each worker's epoll watches). A worker, per epoll round: reads what its
// ready connections sent (one request per connection at most), sends the
// memcached gets of all completed requests pipelined on its own memcached
// connection, computes their histograms while memcached answers, then reads
// the references, compares, and replies.
#include "fv_mc_client.h"
#include "fv_memcached.h"
#include "fv_record.h"
#include "fv_server_common.h"

#include <netinet/tcp.h>
#include <sys/epoll.h>

#include <memory>
#include <thread>

namespace fv {
namespace {

struct Conn {
  int fd;
  RequestReader reader;
};

class Worker {
 public:
  Worker(const ServerConfig &config, ServerStats *stats)
      : config_(config), stats_(stats), mc_(config.memcached, config.mc_timeout_ms) {
    build_uniform_table(table_);
  }

  int start() {
    epfd_ = epoll_create1(0);
    if (epfd_ < 0) return -errno;
    if (int rc = inbox_.open(); rc < 0) return rc;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the inbox's wake-up fd
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, inbox_.wake_fd(), &ev) < 0) return -errno;
    thread_ = std::thread([this] { run(); });
    return 0;
  }
  Inbox &inbox() { return inbox_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void adopt() {
    for (int fd : inbox_.take()) {
      const int one = 1;  // replies are small: no Nagle delay on kernel TCP
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      LibcIo::set_nonblocking(fd);
      auto *c = new Conn{fd, {}};
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.ptr = c;
      if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) < 0) close_conn(c);
    }
  }

  void close_conn(Conn *c) {
    epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
    close(c->fd);
    delete c;
  }

  void run() {
    epoll_event events[256];
    std::vector<Conn *> ready;
    while (!g_stop) {
      const int n = epoll_wait(epfd_, events, 256, 100);
      ready.clear();
      for (int i = 0; i < n; ++i) {
        auto *c = static_cast<Conn *>(events[i].data.ptr);
        if (!c) {
          adopt();
          continue;
        }
        const ReadStatus st = c->reader.read<LibcIo>(c->fd, config_.grid);
        if (st == ReadStatus::kComplete) {
          ready.push_back(c);
        } else if (st == ReadStatus::kBad) {
          const Reply r = error_reply(c->reader.header.request_id, c->reader.bad);
          stats_->count(r);
          send_reply<LibcIo>(c->fd, r);
          close_conn(c);  // the stream cannot be resynchronised
        } else if (st == ReadStatus::kClosed) {
          if (c->reader.have > 0) stats_->closed_mid_request.fetch_add(1);
          close_conn(c);
        }
      }
      if (!ready.empty()) serve(ready);
    }
    // Leaving: the kernel closes what is left when the process exits.
  }

  // Every completed request of this round: gets pipelined, histograms while
  // memcached answers, then compare and reply.
  void serve(const std::vector<Conn *> &ready) {
    const size_t n = ready.size();
    keys_.resize(n);
    replies_.resize(n);
    hists_.resize(n * kMaxBins);
    for (size_t i = 0; i < n; ++i) {
      const RequestHeader &h = ready[i]->reader.header;
      keys_[i] = make_key(h.width, h.height, h.identity);
      replies_[i] = error_reply(h.request_id, kDatabase);  // unless memcached answers
    }
    auto features = [&](size_t i) {
      const RequestHeader &h = ready[i]->reader.header;
      return Features{h.width, h.height, config_.grid};
    };
    mc_.get_many(
        keys_.data(), n,
        [&](size_t i, McStatus status, const uint8_t *value, size_t len) {
          const Features f = features(i);
          const uint64_t id = ready[i]->reader.header.request_id;
          if (reference_usable(status, value, len, f, id, &replies_[i]))
            replies_[i] = verdict_reply(id, f, chi2_q16(&hists_[i * kMaxBins], value, f.bins()), config_.threshold_q16);
        },
        [&] {
          for (size_t i = 0; i < n; ++i)
            lbp_histogram(ready[i]->reader.image(), features(i), table_, &hists_[i * kMaxBins]);
        });
    for (size_t i = 0; i < n; ++i) {
      stats_->count(replies_[i]);
      ready[i]->reader.reset();
      if (!send_reply<LibcIo>(ready[i]->fd, replies_[i])) close_conn(ready[i]);
    }
  }

  const ServerConfig &config_;
  ServerStats *stats_;
  McClient<LibcIo> mc_;
  uint8_t table_[256];
  int epfd_ = -1;
  std::thread thread_;
  Inbox inbox_;
  std::vector<McKey> keys_;
  std::vector<Reply> replies_;
  std::vector<uint32_t> hists_;
};

}  // namespace
}  // namespace fv

int main(int argc, char **argv) {
  using namespace fv;
  ServerConfig config;
  int workers = 4;
  Flags flags{argc, argv};
  while (!flags.done()) {
    const std::string name = flags.name();
    if (config.parse(name, flags)) continue;
    if (name == "--workers") {
      workers = static_cast<int>(flags.number());
    } else {
      std::fprintf(stderr, "usage: %s [--workers N] %s\n", argv[0], ServerConfig::kUsage);
      return 2;
    }
  }
  if (!config.check("fv_cpu_server") || workers < 1) return 2;
  install_stop_handlers();
  const int listener = listen_on<LibcIo>(config.port);
  if (listener < 0) {
    std::fprintf(stderr, "fv_cpu_server: listen on port %d: %s\n", config.port, strerror(-listener));
    return 1;
  }
  ServerStats stats;
  std::vector<std::unique_ptr<Worker>> pool;
  for (int i = 0; i < workers; ++i) {
    pool.push_back(std::make_unique<Worker>(config, &stats));
    if (int rc = pool.back()->start(); rc < 0) {
      std::fprintf(stderr, "fv_cpu_server: worker: %s\n", strerror(-rc));
      return 1;
    }
  }
  std::printf("fv_cpu_server: listening on port %d (%d workers, grid %u, memcached %s)\n", config.port, workers,
              config.grid, config.memcached_text.c_str());
  std::fflush(stdout);
  accept_loop<LibcIo>(listener, pool, &stats);
  for (auto &w : pool) w->join();
  stats.print("fv_cpu_server");
  return 0;
}
