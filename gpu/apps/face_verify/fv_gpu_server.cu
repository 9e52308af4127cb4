// Face verification, GPU-native server: one persistent kernel on gpusock.
// Every block is a server of its own:
//   - it gpolls its client connections (up to --conns) and, while it has
//     room, the shared listener, and accepts;
//   - it receives a request into GPU memory with all its threads (the header
//     is validated before the image is read);
//   - it sends the memcached `get` on ITS OWN gpusock socket (a GPU client of
//     the CPU memcached, kept open, reopened when memcached went away),
//     computes the LBP histogram in shared memory while memcached answers,
//     receives the reference, computes the chi-square, and replies.
// No CPU code runs on the request path but the proxy thread. On a machine
// without a GPU (or with --host-backend) the same kernel runs on the host
// backend.
//
//   fv_gpu_server [--blocks 128] [--threads 256] [--conns 4] [--max-dim 1024]
//                 [--ring-kib 128] [--transport T] [--host-backend] [--seconds S]
//                 [--port 7000] [--memcached 127.0.0.1:11211] [--grid 8]
//                 [--threshold-q16 T] [--mc-timeout-ms 1000]
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
inline constexpr size_t kMcBufferBytes = (kMcMaxLine + kMaxRecordBytes + 7 + 15) & ~size_t(15);

// What a block counts (host-mapped; written once, when the kernel ends).
struct BlockCounters {
  unsigned long long verdicts[4], bad_requests, database_errors, connections, closed_mid_request, mc_connects;
  // Where an answered request's time goes (GPU clock, summed): receiving it
  // (first bytes seen to last), sending the get, the histogram, waiting for
  // memcached's reply after it, the chi-square, sending the reply.
  unsigned long long timed, ns_receive, ns_get, ns_histogram, ns_reference, ns_chi2, ns_reply;
};

struct Params {
  int conns;  // per block
  uint32_t grid, threshold_q16, max_dim;
  int mc_timeout_ms;
  sockaddr_in memcached;
  size_t conn_bytes;   // receive buffer per connection: a whole request of max_dim x max_dim
  size_t block_bytes;  // GPU memory per block (BlockMemory below)
};

// One block's slice of GPU memory.
struct BlockMemory {
  gpollfd *polls;         // [0] the listener, [1..conns] connections
  uint8_t *conn;          // conns x conn_bytes
  uint8_t *mc;            // the memcached reply
  uint8_t *cmd;           // the get command (64 bytes)
  uint8_t *reply;         // the reply (64 bytes)
  uint8_t *host_scratch;  // host backend: the block's "shared memory"
};

GS_HD size_t block_bytes(int conns, size_t conn_bytes) {
  return 64 * (conns + 1) + conns * conn_bytes + kMcBufferBytes + 128 + kHostScratchBytes;
}

GS_HD BlockMemory block_memory(uint8_t *base, const Params &p) {
  BlockMemory m;
  m.polls = reinterpret_cast<gpollfd *>(base);
  m.conn = base + 64 * (p.conns + 1);
  m.mc = m.conn + p.conns * p.conn_bytes;
  m.cmd = m.mc + kMcBufferBytes;
  m.reply = m.cmd + 64;
  m.host_scratch = m.reply + 64;
  return m;
}

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
      for (int i = 1; i <= p.conns; ++i)
        if (m.polls[i].fd >= 0 && m.polls[i].revents) serve(m, s, i, &st);
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

  // Reads what connection i sent; a complete request is answered.
  GS_HD void serve(const BlockMemory &m, const BlockScratch &s, int i, BlockState *st) const {
    uint8_t *buf = m.conn + size_t(i - 1) * p.conn_bytes;
    int &have = st->have[i - 1];
    for (;;) {
      const bool header_in = have >= int(kRequestHeaderBytes);
      const RequestHeader h = decode_request_header(buf);  // meaningful once header_in
      const size_t want = header_in ? request_bytes(h) : kRequestHeaderBytes;
      if (header_in && size_t(have) == want) {
        answer(m, s, i, h, buf + kRequestHeaderBytes, st);
        return;  // one request per connection per round: fair to the others
      }
      if (have == 0) st->first_ns[i - 1] = gpusock::now_ns();
      const ssize_t n = grecv(ctx, m.polls[i].fd, buf + have, want - have);
      if (n == -EAGAIN) return;
      if (n <= 0) return close_conn(m, i, st);  // EOF (maybe mid-request) or an error
      have += static_cast<int>(n);
      if (have == int(kRequestHeaderBytes)) {
        const RequestHeader hh = decode_request_header(buf);
        Reason bad = validate_request(hh, p.grid);
        if (bad == kReasonNone && (hh.width > p.max_dim || hh.height > p.max_dim)) bad = kBadSize;
        if (bad != kReasonNone) {
          ++st->n.bad_requests;
          send_reply(m, i, error_reply(hh.request_id, bad), st);
          if (m.polls[i].fd >= 0) close_conn(m, i, st);  // the stream cannot be resynchronised
          return;
        }
      }
    }
  }

  GS_HD void answer(const BlockMemory &m, const BlockScratch &s, int i, const RequestHeader &h, const uint8_t *image,
                    BlockState *st) const {
    const uint64_t t0 = gpusock::now_ns();
    st->n.ns_receive += t0 - st->first_ns[i - 1];
    const Features f{h.width, h.height, p.grid};
    char key[kMaxKeyBytes];
    const size_t key_len = format_key(key, h.width, h.height, h.identity);
    if (thread_rank() == 0) mc_format_get(reinterpret_cast<char *>(m.cmd), key, key_len);
    sync_block();
    const McReply got = fetch(m, s, f, key, key_len, image, st);
    Reply r;
    if (got.status == kMcError) {
      r = error_reply(h.request_id, kDatabase);
      ++st->n.database_errors;
    } else if (reference_usable(got.status, m.mc + got.data_offset, got.data_len, f, h.request_id, &r)) {
      const uint64_t t1 = gpusock::now_ns();
      r = verdict_reply(h.request_id, f, block_chi2(m.mc + got.data_offset, f, s), p.threshold_q16);
      st->n.ns_chi2 += gpusock::now_ns() - t1;
    }
    st->have[i - 1] = 0;
    const uint64_t t2 = gpusock::now_ns();
    send_reply(m, i, r, st);
    st->n.ns_reply += gpusock::now_ns() - t2;
    ++st->n.timed;
  }

  // The get on the block's memcached socket, the histogram while memcached
  // answers, then the reply. A failure on a connection that had worked
  // (memcached restarted) is retried once on a new one; a failure on a new
  // connection is the answer (kMcError).
  GS_HD McReply fetch(const BlockMemory &m, const BlockScratch &s, const Features &f, const char *key, size_t key_len,
                      const uint8_t *image, BlockState *st) const {
    const size_t cmd_len = 4 + key_len + 2;
    bool histogram_done = false;
    for (;;) {
      const bool fresh = st->mc < 0;
      if (fresh && (st->mc = connect_memcached(st)) < 0) return McReply{kMcError, 0, 0, 0};
      const uint64_t t0 = gpusock::now_ns();
      const ssize_t sent = gsend(ctx, st->mc, m.cmd, cmd_len, 0, p.mc_timeout_ms);
      const uint64_t t1 = gpusock::now_ns();
      if (!histogram_done) block_histogram(image, f, s);
      histogram_done = true;
      const uint64_t t2 = gpusock::now_ns();
      const McReply r = sent == ssize_t(cmd_len) ? receive_reply(m, key, key_len, st->mc) : McReply{kMcError, 0, 0, 0};
      st->n.ns_get += t1 - t0;
      st->n.ns_histogram += t2 - t1;
      st->n.ns_reference += gpusock::now_ns() - t2;
      if (r.status != kMcError) return r;
      gclose(ctx, st->mc);
      st->mc = -1;
      if (fresh) return r;
    }
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

  // Receives one get's reply into m.mc; every thread parses it (the same bytes).
  GS_HD McReply receive_reply(const BlockMemory &m, const char *key, size_t key_len, int sock) const {
    size_t got = 0;
    for (;;) {
      const McReply r = mc_parse_get(m.mc, got, key, key_len, kMaxRecordBytes);
      if (r.status != kMcNeedMore) {
        if (r.status != kMcError && r.total != got) return McReply{kMcError, 0, 0, 0};  // bytes nobody asked for
        return r;
      }
      const size_t want = r.total ? r.total - got : kMcBufferBytes - got;
      const ssize_t n = grecv(ctx, sock, m.mc + got, want, 0, p.mc_timeout_ms);
      if (n <= 0) return McReply{kMcError, 0, 0, 0};
      got += static_cast<size_t>(n);
    }
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
inline constexpr int kMaxProxies = 4;
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
  const double n = t.timed ? double(t.timed) : 1.0;
  std::printf(
      "fv_gpu_server: %llu requests; per request us: receiving %.1f, get %.1f, histogram %.1f, waiting for the "
      "reference %.1f, chi-square %.1f, reply %.1f\n",
      t.timed, t.ns_receive / n / 1e3, t.ns_get / n / 1e3, t.ns_histogram / n / 1e3, t.ns_reference / n / 1e3,
      t.ns_chi2 / n / 1e3, t.ns_reply / n / 1e3);
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
  p.block_bytes = (block_bytes(o.conns, p.conn_bytes) + 255) & ~size_t(255);
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
