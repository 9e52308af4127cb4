// Face verification, host-centric GPU server: the design GPUnet compared
// against, done as well as we know how. CPU threads own the network (gpusock
// CPU sockets, libgpusock's gs_* calls) and drive the GPU:
//   - I/O threads (--io-threads) each own a share of the client connections
//     (an acceptor hands them out) and one memcached connection;
//   - each thread collects completed requests into a batch in pinned memory;
//     a batch goes when it is full (--batch), when its oldest request waited
//     --batch-timeout-us, or at once when the GPU has nothing of this thread's
//     to do (so light load is not delayed and heavy load batches itself);
//   - going: the images' copy to the GPU starts on the batch's CUDA stream,
//     the references come from memcached meanwhile (pipelined gets), then the
//     references' copy, ONE kernel for the whole batch (a block per request:
//     histogram + chi-square), the results' copy back, an event;
//   - double buffering: two buffer sets per thread, so the next batch is
//     received (and can be launched) while the previous one is on the GPU;
//     replies go out when a batch's event has fired, in order.
// Without a GPU (CI) the same program runs the batch kernel on the host
// backend and copies are memcpy.
//
//   fv_hostcentric_server [--io-threads 4] [--batch 64] [--batch-timeout-us 100]
//       [--threads 256] [--max-dim 1024] [--batch-mib 16] [--host-backend]
//       [--port 7000] [--memcached 127.0.0.1:11211] [--grid 8] [--threshold-q16 T]
//       [--mc-timeout-ms 1000]
#include "fv_batch_device.cuh"
#include "fv_gs_io.h"
#include "fv_kernels.cuh"
#include "fv_mc_client.h"
#include "fv_server_common.h"

#include <algorithm>
#include <memory>
#include <thread>

namespace fv {
namespace {

using gpusock::Backend;

struct ItemMeta {  // one GPU item of a batch
  uint64_t request_id;
  uint32_t image_offset, record_index;
  uint16_t width, height;
};

struct BatchKernel {
  const uint8_t *images;
  const ItemMeta *meta;
  const uint8_t *records;  // record_stride apart
  Reply *results;
  uint32_t grid, threshold_q16, record_stride;
  uint8_t *host_scratch;  // host backend: kHostScratchBytes per block

  GS_HD void operator()() const {
    const unsigned b = gpusock::block_index();
    const ItemMeta m = meta[b];
    const Features f{m.width, m.height, grid};
    const BlockScratch s = block_scratch(host_scratch ? host_scratch + size_t(b) * kHostScratchBytes : nullptr);
    block_init_table(s);
    block_histogram(images + m.image_offset, f, s);
    const uint64_t chi2 = block_chi2(records + size_t(m.record_index) * record_stride, f, s);
    if (gpusock::thread_rank() == 0) results[b] = verdict_reply(m.request_id, f, chi2, threshold_q16);
  }
};

struct Config {
  ServerConfig server;
  int io_threads = 4, batch = 64, batch_timeout_us = 100;
  unsigned threads = 0;  // per block; 0: by backend
  uint32_t max_dim = kMaxDim, batch_mib = 16;
  bool force_host = false;
};

struct Conn {
  int fd;
  RequestReader reader;
  int pending = 0;  // requests of it in batches
  bool closed = false;
};

// One buffer set: a batch being collected, or on the GPU.
struct Batch {
  struct Item {
    Conn *conn;
    RequestHeader header;
    uint32_t image_offset;
    bool compare;  // on the GPU; else `reply` was decided on the CPU
    Reply reply;
  };
  BatchDevice::Queue queue;
  uint8_t *h_images, *d_images, *h_records, *d_records, *host_scratch = nullptr;
  ItemMeta *h_meta, *d_meta;
  Reply *h_results, *d_results;
  std::vector<Item> items;
  std::vector<McKey> keys;
  size_t image_bytes = 0;
  uint64_t first_ns = 0, seq = 0, dispatch_ns = 0, queued_ns = 0;
  int gpu_items = 0;
  bool in_flight = false;
};

// Where a batch's time goes, summed over the run (printed at exit): waiting
// to be dispatched, memcached's gets, queueing copies and kernel, the GPU
// until the event is seen, and the replies.
struct PhaseTotals {
  std::atomic<uint64_t> batches{0}, items{0}, collect_ns{0}, memcached_ns{0}, queue_ns{0}, gpu_ns{0}, reply_ns{0};

  void print(const char *who) const {
    const double n = batches.load() ? double(batches.load()) : 1.0;
    std::printf(
        "%s: batches %llu (%.1f requests each); per batch us: collecting %.1f, memcached %.1f, queueing %.1f, "
        "GPU %.1f, replying %.1f\n",
        who, (unsigned long long)batches.load(), items.load() / n, collect_ns.load() / n / 1e3,
        memcached_ns.load() / n / 1e3, queue_ns.load() / n / 1e3, gpu_ns.load() / n / 1e3, reply_ns.load() / n / 1e3);
    std::fflush(stdout);
  }
};

class IoThread {
 public:
  IoThread(const Config &c, BatchDevice *dev, ServerStats *stats, PhaseTotals *phases)
      : c_(c),
        dev_(dev),
        stats_(stats),
        phases_(phases),
        mc_(c.server.memcached, c.server.mc_timeout_ms),
        record_stride_(static_cast<uint32_t>((record_bytes(c.server.grid) + 15) & ~size_t(15))),
        image_capacity_(size_t(c.batch_mib) << 20) {}

  int start() {
    for (Batch &b : sets_) {
      const size_t n = size_t(c_.batch);
      if (dev_->make_queue(&b.queue) < 0) return -ENODEV;
      b.h_images = static_cast<uint8_t *>(dev_->host_alloc(image_capacity_));
      b.d_images = static_cast<uint8_t *>(dev_->device_alloc(image_capacity_));
      b.h_records = static_cast<uint8_t *>(dev_->host_alloc(n * record_stride_));
      b.d_records = static_cast<uint8_t *>(dev_->device_alloc(n * record_stride_));
      b.h_meta = static_cast<ItemMeta *>(dev_->host_alloc(n * sizeof(ItemMeta)));
      b.d_meta = static_cast<ItemMeta *>(dev_->device_alloc(n * sizeof(ItemMeta)));
      b.h_results = static_cast<Reply *>(dev_->host_alloc(n * sizeof(Reply)));
      b.d_results = static_cast<Reply *>(dev_->device_alloc(n * sizeof(Reply)));
      if (!dev_->gpu()) b.host_scratch = static_cast<uint8_t *>(dev_->host_alloc(n * kHostScratchBytes));
      if (!b.h_images || !b.d_images || !b.h_records || !b.d_records || !b.h_meta || !b.d_meta || !b.h_results ||
          !b.d_results || (!dev_->gpu() && !b.host_scratch))
        return -ENOMEM;
      b.items.reserve(n);
      b.keys.resize(n);
    }
    if (int rc = inbox_.open(); rc < 0) return rc;
    thread_ = std::thread([this] { run(); });
    return 0;
  }
  Inbox &inbox() { return inbox_; }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  Batch &collecting() { return sets_[cur_]; }

  void run() {
    std::vector<pollfd> fds;
    while (!g_stop) {
      finish_oldest(false);
      std::erase_if(conns_, [](Conn *c) { return c->closed; });
      for (Conn *c : graveyard_) delete c;  // closed, out of conns_, in no batch
      graveyard_.clear();
      const bool busy = sets_[0].in_flight || sets_[1].in_flight || !collecting().items.empty();
      fds.assign(1, pollfd{inbox_.wake_fd(), POLLIN, 0});  // gs_poll mixes kernel fds and gpusock sockets
      for (Conn *c : conns_) fds.push_back(pollfd{c->fd, POLLIN, 0});
      const int n = GsIo::poll(fds.data(), fds.size(), busy ? 0 : 100);  // spin while work is under way
      if (n > 0) {
        if (fds[0].revents) adopt();
        for (size_t i = 1; i < fds.size(); ++i)
          if (fds[i].revents) read_from(conns_[i - 1]);
      }
      maybe_dispatch();
    }
    for (int i = 0; i < 2; ++i) finish_oldest(true);
  }

  void adopt() {
    for (int fd : inbox_.take()) {
      GsIo::set_nonblocking(fd);
      conns_.push_back(new Conn{fd, {}});
    }
  }

  void close_conn(Conn *c) {
    if (c->closed) return;
    GsIo::close(c->fd);
    c->closed = true;
    if (c->reader.have > 0) stats_->closed_mid_request.fetch_add(1);
    if (c->pending == 0) graveyard_.push_back(c);
  }

  void reply_now(Conn *c, const Reply &r) {
    stats_->count(r);
    if (!c->closed && !send_reply<GsIo>(c->fd, r)) close_conn(c);
  }

  // Completed requests go into the collecting batch while it has room.
  void read_from(Conn *c) {
    while (!c->closed && collecting().items.size() < size_t(c_.batch)) {
      const ReadStatus st = c->reader.read<GsIo>(c->fd, c_.server.grid);
      const RequestHeader &h = c->reader.header;
      if (st == ReadStatus::kPartial) return;
      if (st == ReadStatus::kClosed) return close_conn(c);
      if (st == ReadStatus::kBad || h.width > c_.max_dim || h.height > c_.max_dim) {
        reply_now(c, error_reply(h.request_id, st == ReadStatus::kBad ? c->reader.bad : kBadSize));
        return close_conn(c);  // the stream cannot be resynchronised
      }
      append(c);
    }
  }

  void append(Conn *c) {
    const size_t bytes = size_t(c->reader.header.width) * c->reader.header.height;
    if (collecting().image_bytes + bytes > image_capacity_) dispatch();  // full by bytes
    Batch &b = collecting();
    if (b.items.empty()) b.first_ns = now_ns();
    const uint32_t offset = static_cast<uint32_t>(b.image_bytes);
    memcpy(b.h_images + offset, c->reader.image(), bytes);
    b.image_bytes = (b.image_bytes + bytes + 15) & ~size_t(15);
    b.items.push_back(Batch::Item{c, c->reader.header, offset, false, {}});
    ++c->pending;
    c->reader.reset();
  }

  void maybe_dispatch() {
    const Batch &b = collecting();
    if (b.items.empty()) return;
    const bool gpu_idle = !sets_[0].in_flight && !sets_[1].in_flight;
    if (gpu_idle || b.items.size() >= size_t(c_.batch) || now_ns() - b.first_ns >= uint64_t(c_.batch_timeout_us) * 1000)
      dispatch();
  }

  // Sends the collecting batch on its way and makes the other set the collecting one.
  void dispatch() {
    Batch &b = collecting();
    if (b.items.empty()) return;
    if (sets_[1 - cur_].in_flight) finish_oldest(true);  // both sets busy: wait for the older
    b.dispatch_ns = now_ns();
    const size_t n = b.items.size();
    for (size_t i = 0; i < n; ++i) {
      const RequestHeader &h = b.items[i].header;
      b.keys[i] = make_key(h.width, h.height, h.identity);
    }
    const int rc = mc_.get_many(
        b.keys.data(), n,
        [&](size_t i, McStatus status, const uint8_t *value, size_t len) {
          Batch::Item &it = b.items[i];
          const Features f{it.header.width, it.header.height, c_.server.grid};
          it.compare = reference_usable(status, value, len, f, it.header.request_id, &it.reply);
          if (it.compare) memcpy(b.h_records + i * record_stride_, value, len);
        },
        [&] { dev_->to_device(b.d_images, b.h_images, b.image_bytes, b.queue); });  // while memcached works
    const uint64_t got_ns = now_ns();
    b.gpu_items = 0;
    for (size_t i = 0; i < n; ++i) {
      Batch::Item &it = b.items[i];
      if (rc < 0) it.compare = false, it.reply = error_reply(it.header.request_id, kDatabase);
      if (!it.compare) continue;
      b.h_meta[b.gpu_items++] =
          ItemMeta{it.header.request_id, it.image_offset, static_cast<uint32_t>(i), it.header.width, it.header.height};
    }
    if (b.gpu_items > 0) {
      dev_->to_device(b.d_meta, b.h_meta, sizeof(ItemMeta) * b.gpu_items, b.queue);
      dev_->to_device(b.d_records, b.h_records, n * record_stride_, b.queue);
      const BatchKernel k{b.d_images,     b.d_meta,       b.d_records,
                          b.d_results,    c_.server.grid, c_.server.threshold_q16,
                          record_stride_, b.host_scratch};
      if (dev_->launch(static_cast<unsigned>(b.gpu_items), c_.threads, k, b.queue) < 0) fatal("kernel launch");
      dev_->to_host(b.h_results, b.d_results, sizeof(Reply) * b.gpu_items, b.queue);
    }
    if (dev_->record(b.queue) < 0) fatal("event");
    b.queued_ns = now_ns();
    phases_->collect_ns += b.dispatch_ns - b.first_ns;
    phases_->memcached_ns += got_ns - b.dispatch_ns;
    phases_->queue_ns += b.queued_ns - got_ns;
    b.in_flight = true;
    b.seq = ++dispatched_;
    cur_ = 1 - cur_;
  }

  // Replies to the older in-flight batch once it is done (wait: until it is).
  void finish_oldest(bool wait) {
    Batch *b = nullptr;
    for (Batch &s : sets_)
      if (s.in_flight && (!b || s.seq < b->seq)) b = &s;
    if (!b) return;
    const int rc = dev_->done(b->queue, wait);
    if (rc == 0) return;
    if (rc < 0) fatal("the GPU failed");
    const uint64_t done_ns = now_ns();
    int g = 0;
    for (Batch::Item &it : b->items) {
      const Reply r = it.compare ? b->h_results[g++] : it.reply;
      --it.conn->pending;
      reply_now(it.conn, r);
      if (it.conn->closed && it.conn->pending == 0 &&
          std::find(graveyard_.begin(), graveyard_.end(), it.conn) == graveyard_.end())
        graveyard_.push_back(it.conn);
    }
    phases_->batches += 1;
    phases_->items += b->items.size();
    phases_->gpu_ns += done_ns - b->queued_ns;
    phases_->reply_ns += now_ns() - done_ns;
    b->items.clear();
    b->image_bytes = 0;
    b->in_flight = false;
  }

  [[noreturn]] void fatal(const char *what) {
    std::fprintf(stderr, "fv_hostcentric_server: %s\n", what);
    std::exit(1);
  }

  const Config &c_;
  BatchDevice *dev_;
  ServerStats *stats_;
  PhaseTotals *phases_;
  McClient<GsIo> mc_;
  const uint32_t record_stride_;
  const size_t image_capacity_;
  Batch sets_[2];
  int cur_ = 0;
  uint64_t dispatched_ = 0;
  std::vector<Conn *> conns_, graveyard_;
  std::thread thread_;
  Inbox inbox_;
};

bool parse(int argc, char **argv, Config *c) {
  Flags f{argc, argv};
  while (!f.done()) {
    const std::string n = f.name();
    if (c->server.parse(n, f)) continue;
    if (n == "--io-threads") c->io_threads = static_cast<int>(f.number());
    else if (n == "--batch") c->batch = static_cast<int>(f.number());
    else if (n == "--batch-timeout-us") c->batch_timeout_us = static_cast<int>(f.number());
    else if (n == "--threads") c->threads = static_cast<unsigned>(f.number());
    else if (n == "--max-dim") c->max_dim = static_cast<uint32_t>(f.number());
    else if (n == "--batch-mib") c->batch_mib = static_cast<uint32_t>(f.number());
    else if (n == "--host-backend") c->force_host = true;
    else return false;
  }
  return c->server.check("fv_hostcentric_server") && c->io_threads >= 1 && c->batch >= 1 && c->batch_timeout_us >= 0 &&
         c->max_dim >= kMinDim && c->max_dim <= kMaxDim &&
         (size_t(c->batch_mib) << 20) >= size_t(c->max_dim) * c->max_dim;
}

}  // namespace
}  // namespace fv

int main(int argc, char **argv) {
  using namespace fv;
  Config c;
  if (!parse(argc, argv, &c)) {
    std::fprintf(stderr,
                 "usage: %s [--io-threads N] [--batch B] [--batch-timeout-us US] [--threads T] [--max-dim D] "
                 "[--batch-mib M (>= max-dim^2)] [--host-backend] %s\n",
                 argv[0], ServerConfig::kUsage);
    return 2;
  }
  install_stop_handlers();
  const Backend backend = gpusock::choose_backend(c.force_host);
  if (!c.threads) c.threads = backend == Backend::kCuda ? 256 : 4;  // emulated threads are host threads
  BatchDevice device(backend);
  const int listener = listen_on<GsIo>(c.server.port);
  if (listener < 0) {
    std::fprintf(stderr, "fv_hostcentric_server: listen on port %d: %s (%s)\n", c.server.port, gs_status_name(listener),
                 gs_last_error());
    return 1;
  }
  ServerStats stats;
  PhaseTotals phases;
  std::vector<std::unique_ptr<IoThread>> pool;
  for (int i = 0; i < c.io_threads; ++i) {
    pool.push_back(std::make_unique<IoThread>(c, &device, &stats, &phases));
    if (int rc = pool.back()->start(); rc < 0) {
      std::fprintf(stderr, "fv_hostcentric_server: I/O thread: %s\n", gs_status_name(rc));
      return 1;
    }
  }
  std::printf(
      "fv_hostcentric_server: listening on port %d (%s backend, %d I/O threads, batch %d, timeout %d us, "
      "grid %u, memcached %s)\n",
      c.server.port, gpusock::backend_name(backend), c.io_threads, c.batch, c.batch_timeout_us, c.server.grid,
      c.server.memcached_text.c_str());
  std::fflush(stdout);
  accept_loop<GsIo>(listener, pool, &stats);
  for (auto &t : pool) t->join();
  stats.print("fv_hostcentric_server");
  phases.print("fv_hostcentric_server");
  return 0;
}
