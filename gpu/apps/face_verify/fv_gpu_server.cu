// Face verification, GPU-native server: one persistent kernel on gpusock.
// Every block is a server of its own:
//   - it gpolls its client connections (up to --conns) and, while it has
//     room, the shared listener, and accepts;
//   - it receives what its ready connections sent into GPU memory with all
//     its threads (each header is validated before the image is read), and
//     takes the requests that are complete as one batch;
//   - it sends the batch's memcached gets, pipelined, on ITS OWN gpusock
//     socket (a GPU client of the CPU memcached, kept open, reopened when
//     memcached went away), computes the batch's LBP histograms while
//     memcached answers, receives the references, computes each chi-square
//     and replies on each connection.
// No CPU code runs on the request path but the proxy thread. On a machine
// without a GPU (or with --host-backend) the same kernel runs on the host
// backend.
//
//   fv_gpu_server [--blocks 128] [--threads 256] [--conns 4] [--max-dim 1024]
//                 [--ring-kib 128] [--transport T] [--host-backend] [--seconds S]
//                 [--port 7000] [--memcached 127.0.0.1:11211] [--grid 8]
//                 [--threshold-q16 T] [--mc-timeout-ms 1000] [--proxies K]
#include "fv_kernels.cuh"
#include "fv_memcached.h"
#include "fv_server_common.h"

#include <unistd.h>

#include <algorithm>

namespace fv {
namespace {

using namespace gpusock;

inline constexpr int kMaxConnsPerBlock = 16;
inline constexpr uint32_t kIdleSleepNs = 1000000;  // a block without connections looks at the listener this often
inline constexpr size_t kMcBufferBytes = (kMcMaxLine + kMaxRecordBytes + 7 + 15) & ~size_t(15);  // one get's reply
inline constexpr size_t kCmdBytes = 64;  // one get's line (kMcMaxGetBytes, rounded up)

// What a block counts (host-mapped; written once, when the kernel ends).
struct BlockCounters {
  unsigned long long verdicts[4], bad_requests, database_errors, connections, closed_mid_request, mc_connects;
  // Where the answered requests' time goes (GPU clock, summed): receiving
  // each (first bytes seen to the batch's start); per batch: sending the
  // gets, the histograms, waiting for memcached's replies after them, the
  // chi-squares, sending the replies.
  unsigned long long timed, batches, ns_receive, ns_get, ns_histogram, ns_reference, ns_chi2, ns_reply;
};

struct Params {
  int conns;  // per block
  uint32_t grid, threshold_q16, max_dim;
  int mc_timeout_ms;
  sockaddr_in memcached;
  size_t conn_bytes;   // receive buffer per connection: a whole request of max_dim x max_dim
  size_t block_bytes;  // GPU memory per block (BlockMemory below)
  GS_HD uint32_t bins() const { return grid * grid * kBins; }
};

// One block's slice of GPU memory; a batch holds at most one request per connection.
struct BlockMemory {
  gpollfd *polls;         // [0] the listener, [1..conns] connections
  uint8_t *conn;          // conns x conn_bytes
  uint8_t *mc;            // conns x kMcBufferBytes: the replies to a batch's gets
  char *cmd;              // conns x kCmdBytes: a batch's gets
  uint8_t *reply;         // the reply (64 bytes)
  uint32_t *hist;         // conns x bins: a batch's histograms
  uint8_t *host_scratch;  // host backend: the block's "shared memory"
};

GS_HD size_t block_bytes(const Params &p) {
  return 64 * (p.conns + 1) + p.conns * (p.conn_bytes + kMcBufferBytes + kCmdBytes + sizeof(uint32_t) * p.bins()) + 64 +
         kHostScratchBytes;
}

GS_HD BlockMemory block_memory(uint8_t *base, const Params &p) {
  BlockMemory m;
  m.polls = reinterpret_cast<gpollfd *>(base);
  m.conn = base + 64 * (p.conns + 1);
  m.mc = m.conn + p.conns * p.conn_bytes;
  m.cmd = reinterpret_cast<char *>(m.mc + p.conns * kMcBufferBytes);
  m.reply = reinterpret_cast<uint8_t *>(m.cmd + p.conns * kCmdBytes);
  m.hist = reinterpret_cast<uint32_t *>(m.reply + 64);
  m.host_scratch = reinterpret_cast<uint8_t *>(m.hist + p.conns * p.bins());
  return m;
}

// The connections whose requests are complete, answered together.
struct Batch {
  int n = 0;
  int slot[kMaxConnsPerBlock];  // indices into BlockMemory::polls
};

struct ListenKernel {
  DeviceContext ctx;
  int port;
  int *out;
  GS_HD void operator()() const {
    const int s = gsocket(ctx, AF_INET, SOCK_STREAM | SOCK_NONBLOCK);  // gaccept never waits: gpoll does
    const sockaddr_in any = ipv4_address(0, 0, 0, 0, static_cast<uint16_t>(port));
    int rc = s < 0 ? s : gbind(ctx, s, reinterpret_cast<const sockaddr *>(&any), sizeof any);
    if (rc == 0) rc = glisten(ctx, s, 1024);
    if (thread_rank() == 0) *out = rc < 0 ? rc : s;
  }
};

// Block-uniform state: every thread keeps an identical copy (all of them see
// the same results of the block-cooperative calls), so none needs a barrier.
struct BlockState {
  int have[kMaxConnsPerBlock];           // bytes of the current request per connection
  uint64_t first_ns[kMaxConnsPerBlock];  // when its first bytes were seen
  int mc = -1;                           // the memcached socket
  BlockCounters n{};
  uint64_t listener_checked = 0;
};

// One block's server, on the sockets of one proxy.
struct BlockServer {
  const DeviceContext &ctx;
  int listener;
  const Params &p;
  uint8_t *memory;          // blocks x p.block_bytes, GPU memory
  BlockCounters *counters;  // per block, host-mapped

  GS_HD void run() const {
    const BlockMemory m = block_memory(memory + size_t(block_index()) * p.block_bytes, p);
    const BlockScratch s = block_scratch(m.host_scratch);
    block_init_table(s);
    BlockState st;
    for (int i = 0; i < kMaxConnsPerBlock; ++i) st.have[i] = 0;
    if (thread_rank() == 0) {
      m.polls[0] = gpollfd{listener, POLLIN, 0};
      for (int i = 1; i <= p.conns; ++i) m.polls[i] = gpollfd{-1, POLLIN, 0};
    }
    sync_block();
    for (unsigned iter = 1;; ++iter) {
      if ((iter & 63) == 0 && gshould_stop(ctx)) break;
      const bool idle = !watch_listener(m, &st);
      // A block without connections looks once and sleeps; one with
      // connections waits for them (and, now and then, the listener).
      const int ready = gpoll(ctx, m.polls, p.conns + 1, idle ? 0 : 1);
      if (ready < 0) break;  // -ESHUTDOWN
      if (ready == 0) {
        if (idle) pause_ns(kIdleSleepNs);
        continue;
      }
      if (m.polls[0].revents & POLLIN) accept_one(m, &st);
      Batch b;
      for (int i = 1; i <= p.conns; ++i)
        if (m.polls[i].fd >= 0 && m.polls[i].revents && receive(m, i, &st)) b.slot[b.n++] = i;
      if (b.n > 0) answer(m, s, b, &st);
    }
    for (int i = 1; i <= p.conns; ++i)
      if (m.polls[i].fd >= 0) gclose(ctx, m.polls[i].fd);
    if (st.mc >= 0) gclose(ctx, st.mc);
    if (thread_rank() == 0) counters[block_index()] = st.n;
  }

  // Whether this round polls the listener; false when the block has no
  // connection (it polls the listener alone, then sleeps kIdleSleepNs). Every
  // block reading the listener's status line on every poll would queue them
  // all at the host bridge (one line: < 1 M reads/s for all blocks together,
  // docs/gpu.md), so a block looks at it every (connections + 1) ms: idle
  // blocks most often, so new connections spread over the blocks.
  GS_HD bool watch_listener(const BlockMemory &m, BlockState *st) const {
    int used = 0;
    for (int i = 1; i <= p.conns; ++i) used += m.polls[i].fd >= 0;
    if (thread_rank() == 0) {
      const uint64_t now = gpusock::now_ns();
      const bool watch = used < p.conns && now - st->listener_checked >= uint64_t(used + 1) * kIdleSleepNs;
      if (watch) st->listener_checked = now;
      m.polls[0].events = watch ? POLLIN : 0;
    }
    return used > 0;  // every thread counted the same connections
  }

  GS_HD void accept_one(const BlockMemory &m, BlockState *st) const {
    const int c = gaccept(ctx, listener, SOCK_NONBLOCK);  // -EAGAIN: another block took it
    if (c < 0) return;
    int slot = 1;
    while (slot <= p.conns && m.polls[slot].fd >= 0) ++slot;
    sync_block();          // everyone has read the free slot before it is taken
    if (slot > p.conns) {  // cannot happen: the listener is watched only with room
      gclose(ctx, c);
      return;
    }
    if (thread_rank() == 0) m.polls[slot] = gpollfd{c, POLLIN, 0};
    st->have[slot - 1] = 0;
    ++st->n.connections;
    sync_block();
  }

  GS_HD void close_conn(const BlockMemory &m, int i, BlockState *st) const {
    if (st->have[i - 1] > 0) ++st->n.closed_mid_request;
    gclose(ctx, m.polls[i].fd);
    if (thread_rank() == 0) m.polls[i].fd = -1;
    st->have[i - 1] = 0;
    sync_block();
  }

  // Reads what connection i sent: true once its request is complete (one
  // request per connection per round: fair to the others).
  GS_HD bool receive(const BlockMemory &m, int i, BlockState *st) const {
    uint8_t *buf = m.conn + size_t(i - 1) * p.conn_bytes;
    int &have = st->have[i - 1];
    for (;;) {
      const bool header_in = have >= int(kRequestHeaderBytes);
      const size_t want = header_in ? request_bytes(decode_request_header(buf)) : kRequestHeaderBytes;
      if (header_in && size_t(have) == want) return true;
      if (have == 0) st->first_ns[i - 1] = gpusock::now_ns();
      const ssize_t n = grecv(ctx, m.polls[i].fd, buf + have, want - have);
      if (n == -EAGAIN) return false;
      if (n <= 0) {  // EOF (maybe mid-request) or an error
        close_conn(m, i, st);
        return false;
      }
      have += static_cast<int>(n);
      if (have == int(kRequestHeaderBytes)) {
        const RequestHeader h = decode_request_header(buf);
        Reason bad = validate_request(h, p.grid);
        if (bad == kReasonNone && (h.width > p.max_dim || h.height > p.max_dim)) bad = kBadSize;
        if (bad != kReasonNone) {
          ++st->n.bad_requests;
          send_reply(m, i, error_reply(h.request_id, bad), st);
          if (m.polls[i].fd >= 0) close_conn(m, i, st);  // the stream cannot be resynchronised
          return false;
        }
      }
    }
  }

  GS_HD const uint8_t *request_of(const BlockMemory &m, int i) const { return m.conn + size_t(i - 1) * p.conn_bytes; }
  GS_HD size_t key_of(const BlockMemory &m, int i, char *key) const {
    const RequestHeader h = decode_request_header(request_of(m, i));
    return format_key(key, h.width, h.height, h.identity);
  }

  // The batch: its gets, its histograms while memcached answers, then each
  // chi-square and reply.
  GS_HD void answer(const BlockMemory &m, const BlockScratch &s, const Batch &b, BlockState *st) const {
    const uint64_t t0 = gpusock::now_ns();
    size_t cmd_len = 0;
    for (int j = 0; j < b.n; ++j) {
      st->n.ns_receive += t0 - st->first_ns[b.slot[j] - 1];
      char key[kMaxKeyBytes];
      const size_t key_len = key_of(m, b.slot[j], key);
      if (thread_rank() == 0) mc_format_get(m.cmd + cmd_len, key, key_len);
      cmd_len += 4 + key_len + 2;  // every thread knows the length
    }
    sync_block();
    McReply got[kMaxConnsPerBlock];
    const bool fetched = fetch(m, s, b, cmd_len, got, st);
    const uint64_t t1 = gpusock::now_ns();
    uint64_t ns_reply = 0;
    for (int j = 0; j < b.n; ++j) {
      const int i = b.slot[j];
      const RequestHeader h = decode_request_header(request_of(m, i));
      const Features f{h.width, h.height, p.grid};
      Reply r;
      if (!fetched) {
        r = error_reply(h.request_id, kDatabase);
        ++st->n.database_errors;
      } else if (reference_usable(got[j].status, m.mc + got[j].data_offset, got[j].data_len, f, h.request_id, &r)) {
        block_copy_bins(s.hist, m.hist + size_t(j) * p.bins(), f.bins());
        r = verdict_reply(h.request_id, f, block_chi2(m.mc + got[j].data_offset, f, s), p.threshold_q16);
      }
      st->have[i - 1] = 0;
      const uint64_t t2 = gpusock::now_ns();
      send_reply(m, i, r, st);
      ns_reply += gpusock::now_ns() - t2;
    }
    st->n.ns_chi2 += gpusock::now_ns() - t1 - ns_reply;
    st->n.ns_reply += ns_reply;
    st->n.timed += b.n;
    ++st->n.batches;
  }

  // The batch's gets on the block's memcached socket, the histograms while
  // memcached answers, then the replies into got[]. A failure on a connection
  // that had worked (memcached restarted) is retried once on a new one; a
  // failure on a new connection is the answer (false).
  GS_HD bool fetch(const BlockMemory &m, const BlockScratch &s, const Batch &b, size_t cmd_len, McReply *got,
                   BlockState *st) const {
    bool histograms_done = false;
    for (;;) {
      const bool fresh = st->mc < 0;
      if (fresh && (st->mc = connect_memcached(st)) < 0) return false;
      const uint64_t t0 = gpusock::now_ns();
      const ssize_t sent = gsend(ctx, st->mc, m.cmd, cmd_len, 0, p.mc_timeout_ms);
      const uint64_t t1 = gpusock::now_ns();
      if (!histograms_done) histograms(m, s, b);
      histograms_done = true;
      const uint64_t t2 = gpusock::now_ns();
      const bool ok = sent == ssize_t(cmd_len) && receive_replies(m, b, st->mc, got);
      st->n.ns_get += t1 - t0;
      st->n.ns_histogram += t2 - t1;
      st->n.ns_reference += gpusock::now_ns() - t2;
      if (ok) return true;
      gclose(ctx, st->mc);
      st->mc = -1;
      if (fresh) return false;
    }
  }

  GS_HD void histograms(const BlockMemory &m, const BlockScratch &s, const Batch &b) const {
    for (int j = 0; j < b.n; ++j) {
      const uint8_t *req = request_of(m, b.slot[j]);
      const RequestHeader h = decode_request_header(req);
      const Features f{h.width, h.height, p.grid};
      block_histogram(req + kRequestHeaderBytes, f, s);
      block_copy_bins(m.hist + size_t(j) * p.bins(), s.hist, f.bins());
    }
  }

  // Receives the replies to the batch's gets, in order, into m.mc; every
  // thread parses them (the same bytes). False on an error, a timeout or
  // bytes nobody asked for.
  GS_HD bool receive_replies(const BlockMemory &m, const Batch &b, int sock, McReply *got) const {
    const size_t room = size_t(b.n) * kMcBufferBytes;
    size_t have = 0, at = 0;  // bytes received; where reply j starts
    for (int j = 0; j < b.n;) {
      char key[kMaxKeyBytes];
      const size_t key_len = key_of(m, b.slot[j], key);
      const McReply r = mc_parse_get(m.mc + at, have - at, key, key_len, kMaxRecordBytes);
      if (r.status == kMcError) return false;
      if (r.status != kMcNeedMore) {
        got[j] = r;
        got[j].data_offset += at;
        at += r.total;
        ++j;
        continue;
      }
      const size_t want = r.total ? at + r.total - have : room - have;
      const ssize_t n = want ? grecv(ctx, sock, m.mc + have, want, 0, p.mc_timeout_ms) : -ENOBUFS;
      if (n <= 0) return false;
      have += static_cast<size_t>(n);
    }
    return have == at;
  }

  GS_HD int connect_memcached(BlockState *st) const {
    ++st->n.mc_connects;
    const int sock = gsocket(ctx, AF_INET, SOCK_STREAM);
    if (sock < 0) return sock;
    const sockaddr_in addr = p.memcached;
    const int rc = gconnect(ctx, sock, reinterpret_cast<const sockaddr *>(&addr), sizeof addr, p.mc_timeout_ms);
    if (rc < 0) {
      gclose(ctx, sock);
      return rc;
    }
    return sock;
  }

  // A client that does not take its replies (its ring holds thousands of
  // them) or is gone loses its connection; nobody else waits for it.
  GS_HD void send_reply(const BlockMemory &m, int i, const Reply &r, BlockState *st) const {
    if (thread_rank() == 0) encode_reply(r, m.reply);
    sync_block();
    ++st->n.verdicts[r.verdict & 3];
    if (gsend(ctx, m.polls[i].fd, m.reply, kReplyBytes, MSG_DONTWAIT) != ssize_t(kReplyBytes)) close_conn(m, i, st);
  }
};

// The kernel: block b serves the connections of proxy b % proxies (each
// proxy is one CPU thread driving its sockets, with a listener of its own on
// port + k), so the CPU side of the sockets can grow past one core.
inline constexpr int kMaxProxies = 8;
struct FaceServerKernel {
  DeviceContext ctx[kMaxProxies];
  int listener[kMaxProxies];
  int proxies;
  Params p;
  uint8_t *memory;
  BlockCounters *counters;
  GS_HD void operator()() const {
    const int k = static_cast<int>(block_index()) % proxies;
    BlockServer{ctx[k], listener[k], p, memory, counters}.run();
  }
};

struct Options {
  ServerConfig server;
  unsigned blocks = 0, threads = 0;  // 0: by backend
  int conns = 4, seconds = 0, proxies = 1;
  uint32_t max_dim = kMaxDim, ring_kib = 128;
  bool force_host = false;
  std::string transport;
};

bool parse(int argc, char **argv, Options *o) {
  Flags f{argc, argv};
  while (!f.done()) {
    const std::string n = f.name();
    if (o->server.parse(n, f)) continue;
    if (n == "--blocks") o->blocks = static_cast<unsigned>(f.number());
    else if (n == "--threads") o->threads = static_cast<unsigned>(f.number());
    else if (n == "--conns") o->conns = static_cast<int>(f.number());
    else if (n == "--proxies") o->proxies = static_cast<int>(f.number());
    else if (n == "--max-dim") o->max_dim = static_cast<uint32_t>(f.number());
    else if (n == "--ring-kib") o->ring_kib = static_cast<uint32_t>(f.number());
    else if (n == "--seconds") o->seconds = static_cast<int>(f.number());
    else if (n == "--transport") o->transport = f.next();
    else if (n == "--host-backend") o->force_host = true;
    else return false;
  }
  return o->server.check("fv_gpu_server") && o->conns >= 1 && o->conns <= kMaxConnsPerBlock && o->proxies >= 1 &&
         o->proxies <= kMaxProxies && o->server.port + o->proxies <= 65536 && o->max_dim >= kMinDim &&
         o->max_dim <= kMaxDim && o->ring_kib >= 8;
}

// Proxy k with its listener on port + k, serving blocks k, k + proxies, ...
int start_proxy(const Options &o, Backend backend, MemoryResource *memory, int k, int *listener_out,
                std::unique_ptr<Proxy> *out) {
  const unsigned blocks = (o.blocks - k + o.proxies - 1) / o.proxies;
  ProxyOptions options;
  options.transport = o.transport;
  options.max_sockets = blocks * unsigned(o.conns + 1) + 8;  // connections + one memcached socket per block
  options.rbuf_size = options.sbuf_size = o.ring_kib * 1024;
  options.request_entries = 4096;
  options.quiet = k > 0;
  if (backend == Backend::kCuda) options.busy_poll_us = -1;  // each proxy owns a core: spin
  if (int rc = Proxy::start(options, memory, out); rc < 0) return rc;
  MemoryBlock fd{};
  if (memory->allocate(MemoryKind::kHostMapped, sizeof(int), &fd) < 0) return -ENOMEM;
  Grid grid;
  const int port = o.server.port + k;
  int rc = grid.start(backend, {1, backend == Backend::kCuda ? 32u : 4u},
                      ListenKernel{(*out)->device_context(), port, static_cast<int *>(fd.device)});
  if (rc == 0) rc = grid.wait();
  if (rc == 0) rc = *static_cast<int *>(fd.host);
  memory->release(&fd);
  *listener_out = rc;
  return rc < 0 ? rc : 0;
}

void print_stats(const BlockCounters *counters, unsigned blocks) {
  ServerStats stats;
  unsigned long long mc_connects = 0;
  BlockCounters t{};
  for (unsigned b = 0; b < blocks; ++b) {
    const BlockCounters &c = counters[b];
    for (auto [sum, part] : {std::pair{&t.timed, c.timed},
                             {&t.batches, c.batches},
                             {&t.ns_receive, c.ns_receive},
                             {&t.ns_get, c.ns_get},
                             {&t.ns_histogram, c.ns_histogram},
                             {&t.ns_reference, c.ns_reference},
                             {&t.ns_chi2, c.ns_chi2},
                             {&t.ns_reply, c.ns_reply}})
      *sum += part;
    for (int v = 0; v < 4; ++v) stats.verdicts[v] += c.verdicts[v];
    stats.bad_requests += c.bad_requests;
    stats.database_errors += c.database_errors;
    stats.connections += c.connections;
    stats.closed_mid_request += c.closed_mid_request;
    mc_connects += c.mc_connects;
  }
  stats.print("fv_gpu_server");
  std::printf("fv_gpu_server: memcached connections opened %llu\n", mc_connects);
  const double n = t.timed ? double(t.timed) : 1.0, nb = t.batches ? double(t.batches) : 1.0;
  std::printf(
      "fv_gpu_server: %llu requests in %llu batches (%.2f a batch); per batch us: gets %.1f, histograms %.1f, "
      "waiting for the references %.1f, chi-squares %.1f, replies %.1f; per request us: receiving %.1f\n",
      t.timed, t.batches, t.timed / nb, t.ns_get / nb / 1e3, t.ns_histogram / nb / 1e3, t.ns_reference / nb / 1e3,
      t.ns_chi2 / nb / 1e3, t.ns_reply / nb / 1e3, t.ns_receive / n / 1e3);
}

}  // namespace
}  // namespace fv

int main(int argc, char **argv) {
  using namespace fv;
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: %s [--blocks B] [--threads T] [--conns C (<= %d)] [--proxies K (<= %d, ports P..P+K-1)] "
                 "[--max-dim D] [--ring-kib K] [--transport T] [--host-backend] [--seconds S] %s\n",
                 argv[0], kMaxConnsPerBlock, kMaxProxies, ServerConfig::kUsage);
    return 2;
  }
  install_stop_handlers();
  const Backend backend = choose_backend(o.force_host);
  const bool gpu = backend == Backend::kCuda;
  if (!o.blocks) o.blocks = gpu ? 128 : 4;
  if (!o.threads) o.threads = gpu ? 256 : 4;  // emulated threads are host threads
  if (o.blocks < unsigned(o.proxies)) o.blocks = unsigned(o.proxies);

  auto memory = memory_resource_for(backend);
  std::unique_ptr<Proxy> proxies[kMaxProxies];
  FaceServerKernel kernel{};
  kernel.proxies = o.proxies;
  for (int k = 0; k < o.proxies; ++k) {
    if (int rc = start_proxy(o, backend, memory.get(), k, &kernel.listener[k], &proxies[k]); rc < 0) {
      std::fprintf(stderr, "fv_gpu_server: proxy %d, listen on port %d: %s\n", k, o.server.port + k,
                   gs_status_name(rc));
      return 1;
    }
    kernel.ctx[k] = proxies[k]->device_context();
  }
  Params &p = kernel.p;
  p.conns = o.conns;
  p.grid = o.server.grid;
  p.threshold_q16 = o.server.threshold_q16;
  p.max_dim = o.max_dim;
  p.mc_timeout_ms = o.server.mc_timeout_ms;
  p.memcached = o.server.memcached;
  p.conn_bytes = (kRequestHeaderBytes + size_t(o.max_dim) * o.max_dim + 15) & ~size_t(15);
  p.block_bytes = (block_bytes(p) + 255) & ~size_t(255);
  MemoryBlock counters_mem{}, device_mem{};
  if (memory->allocate(MemoryKind::kHostMapped, sizeof(BlockCounters) * o.blocks, &counters_mem) < 0 ||
      memory->allocate(MemoryKind::kDevice, p.block_bytes * o.blocks, &device_mem) < 0) {
    std::fprintf(stderr, "fv_gpu_server: out of memory (%zu bytes of GPU memory)\n", p.block_bytes * o.blocks);
    return 1;
  }
  kernel.memory = static_cast<uint8_t *>(device_mem.device);
  kernel.counters = static_cast<BlockCounters *>(counters_mem.device);
  Grid grid;
  if (int rc = grid.start(backend, {o.blocks, o.threads}, kernel); rc < 0) {
    std::fprintf(stderr, "fv_gpu_server: launch: %s\n", gs_status_name(rc));
    return 1;
  }
  std::printf(
      "fv_gpu_server: listening on port %d (%s backend, %u blocks x %u threads, %d connections per block, "
      "%d prox%s on ports %d-%d, grid %u, memcached %s, %s)\n",
      o.server.port, backend_name(backend), o.blocks, o.threads, o.conns, o.proxies, o.proxies > 1 ? "ies" : "y",
      o.server.port, o.server.port + o.proxies - 1, p.grid, o.server.memcached_text.c_str(),
      proxies[0]->placement().c_str());
  std::fflush(stdout);
  for (int t = 0; !g_stop && (o.seconds <= 0 || t < o.seconds * 10); ++t) usleep(100000);
  for (int k = 0; k < o.proxies; ++k) proxies[k]->request_kernel_stop();
  const int rc = grid.wait();
  for (int k = 0; k < o.proxies; ++k) proxies[k]->kernel_exited(rc);
  print_stats(static_cast<const BlockCounters *>(counters_mem.host), o.blocks);
  for (MemoryBlock *mb : {&counters_mem, &device_mem}) memory->release(mb);
  for (int k = 0; k < o.proxies; ++k) proxies[k]->stop();
  if (rc < 0) std::fprintf(stderr, "fv_gpu_server: kernel failed: %s\n", grid.last_error());
  return rc < 0 ? 1 : 0;
}
