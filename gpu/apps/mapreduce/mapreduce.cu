// In-GPU-memory MapReduce over gpusock (GPUnet's scale-out result): word
// count over a synthetic Zipf corpus and K-means over generated points. Each
// worker is one GPU with its own proxy; it generates its share of the input in
// GPU memory, maps it, partitions the result by reducer and streams the
// partitions to the other GPUs through GPU sockets (kernels only: no CPU copy
// on the way), reduces what it receives, and checks its part of the result
// against a CPU reference.
//
//   mapreduce --job wordcount|kmeans [--gpus N]          N GPUs in this process
//   mapreduce --job ... --rank R --ranks N [--gpu I]     one GPU per process
// options: --port P [7600] (worker r listens on P + r) --addr A [127.0.0.1]
//          --hosts A0,A1,... (worker r's address, one per worker: several hosts)
//          --corpus-mib M --vocabulary V [50000] --zipf S [1.0]
//          --points N --k K [16] --iterations I [10] --seed S [1]
//          --blocks B --threads T --host-backend --no-check --label L --json FILE
// One GPU serves as several when there are fewer (--gpus 2 on one GPU: two
// proxies, two workers). Each worker prints one JSON line (and appends it to
// --json): its time from the start barrier to the end barrier, split into
// map, shuffle and reduce, bytes sent, and its check. Exit 0 when all passed.
#include "mr_kmeans.cuh"
#include "mr_reference.h"
#include "mr_wordcount.cuh"

#include <arpa/inet.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace mr {
namespace {

using namespace gpusock;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string job = "wordcount", addr = "127.0.0.1", label, json;
  std::vector<std::string> hosts;  // worker r's IPv4 address; empty: addr for all
  int gpus = 1, rank = -1, ranks = 1, gpu = -1, port = 7600;
  uint64_t corpus_mib = 0, points = 0, seed = 1;
  uint32_t vocabulary = 50000;
  double zipf = 1.0;
  unsigned k = 16, iterations = 10, blocks = 0, threads = 0;
  bool host_backend = false, check = true;
};

struct Result {
  double map_s = 0, shuffle_s = 0, reduce_s = 0, total_s = 0;
  uint64_t input_bytes = 0, sent_bytes = 0;
  std::string check = "skipped";
  int status = 0;
};

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One GPU's worker: its memory, its kernels, its sockets to the others.
class Worker {
 public:
  Worker(GpuSet &gpus, int index, int rank, const Options &o) : gpus_(gpus), index_(index), rank_(rank), o_(o) {
    const bool gpu = gpus.backend() == Backend::kCuda;
    threads_ = o.threads ? o.threads : (gpu ? 256 : 4);
    blocks_ = o.blocks ? o.blocks : (gpu ? 4 * multiprocessors(gpus.device(index)) : 2);
  }
  static unsigned multiprocessors(int device) {
    int n = 132;  // an H100's, if CUDA does not say
#if defined(__CUDACC__)
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
#else
    (void)device;
#endif
    return static_cast<unsigned>(n);
  }
  ~Worker() {
    for (MemoryBlock &b : blocks_held_) gpus_.memory(index_).release(&b);
  }
  int rank() const { return rank_; }
  int ranks() const { return o_.ranks; }

  // GPU memory (or host-mapped memory, when `mapped`), zeroed.
  template <class T>
  T *alloc(uint64_t count, bool mapped = false, T **host = nullptr) {
    MemoryBlock b{};
    if (gpus_.memory(index_).allocate(mapped ? MemoryKind::kHostMapped : MemoryKind::kDevice,
                                      std::max<uint64_t>(count * sizeof(T), 64), &b) < 0)
      return nullptr;
    blocks_held_.push_back(b);
    if (host) *host = static_cast<T *>(b.host);
    return static_cast<T *>(b.device);
  }
  // Runs a kernel on this worker's GPU to its end.
  template <class K>
  int run(const K &kernel, unsigned blocks = 0) {
    Grid grid;
    int rc = gpus_.launch(index_, grid, LaunchShape{blocks ? blocks : blocks_, threads_, 0}, kernel);
    const int done = grid.wait();
    if (done < 0) std::fprintf(stderr, "mapreduce: rank %d: kernel failed: %s\n", rank_, grid.last_error());
    return rc < 0 ? rc : done;
  }
  int copy(void *dst, const void *src, uint64_t n) {
    return run(CopyKernel{static_cast<uint8_t *>(dst), static_cast<const uint8_t *>(src), n});
  }

  // Listens, then connects to every other worker and accepts one connection from each.
  int mesh_up() {
    if (ranks() == 1) return 0;
    for (int d = 0; d < ranks(); ++d) {
      peers_.at[d] = ipv4_address(127, 0, 0, 1, static_cast<uint16_t>(o_.port + d));
      const std::string &host = o_.hosts.empty() ? o_.addr : o_.hosts[d];
      if (inet_pton(AF_INET, host.c_str(), &peers_.at[d].sin_addr) != 1) {
        std::fprintf(stderr, "mapreduce: \"%s\" is not an IPv4 address\n", host.c_str());
        return -EINVAL;
      }
    }
    link::LinkResult *lh = nullptr;
    link::LinkResult *ld = alloc<link::LinkResult>(1, true, &lh);
    int *fds_host = nullptr;
    fds_ = alloc<int>(2 * ranks(), true, &fds_host);  // host-mapped: -1 until connected
    hello_ = alloc<int32_t>(ranks());
    status_ = alloc<int32_t>(2 * ranks(), true, &status_host_);
    zeros_ = alloc<unsigned long long>(ranks());
    scratch_len_ = alloc<unsigned long long>(ranks());
    if (!ld || !fds_ || !hello_ || !status_ || !zeros_ || !scratch_len_) return -ENOMEM;
    for (int i = 0; i < 2 * ranks(); ++i) fds_host[i] = -1;
    int rc = run(link::ListenKernel{gpus_.context(index_), peers_.at[rank_], 2 * ranks(), ld}, 1);
    if (rc == 0) rc = lh->error;
    if (rc < 0) return rc;
    listener_ = lh->fd;
    rc = run(MeshKernel{gpus_.context(index_), listener_, rank_, ranks(), peers_, fds_, status_, hello_},
             2 * (ranks() - 1));
    return rc < 0 ? rc : statuses("mesh");
  }
  void mesh_down() {
    if (ranks() > 1 && listener_ >= 0) run(MeshDownKernel{gpus_.context(index_), fds_, 2 * ranks(), listener_}, 1);
    listener_ = -1;
  }
  // All to all: region d of send to worker d, region s of recv from worker s.
  int exchange(const uint8_t *send, const unsigned long long *send_len, uint8_t *recv, unsigned long long *recv_len,
               uint64_t region) {
    if (ranks() == 1) return 0;
    const int rc = run(
        ExchangeKernel{gpus_.context(index_), rank_, ranks(), fds_, send, send_len, recv, recv_len, region, status_},
        2 * (ranks() - 1));
    return rc < 0 ? rc : statuses("exchange");
  }
  // Every worker got here: an exchange of nothing.
  int barrier() { return exchange(nullptr, zeros_, nullptr, scratch_len_, 0); }
  Regions regions(const uint8_t *send, const unsigned long long *send_len, const uint8_t *recv,
                  const unsigned long long *recv_len, uint64_t region) const {
    return Regions{send, send_len, recv, recv_len, region, rank_, ranks()};
  }

 private:
  int statuses(const char *what) {
    for (int b = 0; b < 2 * (ranks() - 1); ++b)
      if (status_host_[b] < 0) {
        std::fprintf(stderr, "mapreduce: rank %d: %s block %d: %s\n", rank_, what, b, gs_status_name(status_host_[b]));
        return status_host_[b];
      }
    return 0;
  }

  GpuSet &gpus_;
  int index_, rank_;
  const Options &o_;
  unsigned threads_, blocks_;
  std::vector<MemoryBlock> blocks_held_;
  Peers peers_{};
  int *fds_ = nullptr;
  int listener_ = -1;
  int32_t *hello_ = nullptr, *status_ = nullptr, *status_host_ = nullptr;
  unsigned long long *zeros_ = nullptr, *scratch_len_ = nullptr;
};

#define MR_TRY(expr)                 \
  do {                               \
    if (int rc_ = (expr); rc_ < 0) { \
      res->status = rc_;             \
      return rc_;                    \
    }                                \
  } while (0)

// What a worker sent to the others: its send lengths but its own.
uint64_t sent_bytes(const unsigned long long *send_len, const Worker &w) {
  uint64_t sum = 0;
  for (int d = 0; d < w.ranks(); ++d)
    if (d != w.rank()) sum += send_len[d];
  return sum;
}

uint64_t pow2_at_least(uint64_t v) {
  uint64_t p = 1024;
  while (p < v) p <<= 1;
  return p;
}

int word_count(Worker &w, const Options &o, Result *res) {
  const int r = w.rank(), n = w.ranks();
  const uint64_t chunks = (o.corpus_mib << 20) / kChunkBytes;
  const uint64_t first = chunks * r / n, mine = chunks * (r + 1) / n - first;
  const std::vector<uint32_t> cdf = zipf_cdf(o.vocabulary, o.zipf);
  const uint64_t entries = pow2_at_least(2ull * o.vocabulary), region = entries * sizeof(WordEntry);
  uint32_t *cdf_host = nullptr;
  WordEntry *out_host = nullptr;
  unsigned long long *lens_host = nullptr;
  uint32_t *cdf_mapped = w.alloc<uint32_t>(cdf.size(), true, &cdf_host);
  uint32_t *cdf_dev = w.alloc<uint32_t>(cdf.size());
  uint8_t *text = w.alloc<uint8_t>(mine * kChunkBytes);
  WordEntry *map_table = w.alloc<WordEntry>(entries), *reduce_table = w.alloc<WordEntry>(entries);
  uint8_t *send = w.alloc<uint8_t>(n * region), *recv = w.alloc<uint8_t>(n * region);
  unsigned long long *lens = w.alloc<unsigned long long>(2 * n + 2);  // send, recv, errors, output count
  WordEntry *out = w.alloc<WordEntry>(entries, true, &out_host);
  unsigned long long *lens_mapped = w.alloc<unsigned long long>(2 * n + 2, true, &lens_host);
  if (!cdf_mapped || !cdf_dev || !text || !map_table || !reduce_table || !send || !recv || !lens || !out ||
      !lens_mapped)
    return res->status = -ENOMEM;
  unsigned long long *send_len = lens, *recv_len = lens + n, *errors = lens + 2 * n, *count = errors + 1;
  std::memcpy(cdf_host, cdf.data(), cdf.size() * sizeof(uint32_t));
  MR_TRY(w.copy(cdf_dev, cdf_mapped, cdf.size() * sizeof(uint32_t)));
  MR_TRY(w.run(GenerateCorpusKernel{text, mine, first, o.seed, cdf_dev, o.vocabulary}));
  res->input_bytes = mine * kChunkBytes;

  MR_TRY(w.barrier());
  const auto t0 = Clock::now();
  MR_TRY(w.run(MapWordsKernel{text, mine, map_table, entries - 1, errors}));
  res->map_s = since(t0);
  const auto t1 = Clock::now();
  MR_TRY(w.run(PackWordsKernel{map_table, entries, send, region, send_len, unsigned(n)}));
  MR_TRY(w.exchange(send, send_len, recv, recv_len, region));
  res->shuffle_s = since(t1);
  const auto t2 = Clock::now();
  MR_TRY(w.run(MergeWordsKernel{w.regions(send, send_len, recv, recv_len, region), reduce_table, entries - 1, errors}));
  res->reduce_s = since(t2);
  MR_TRY(w.barrier());
  res->total_s = since(t0);

  MR_TRY(w.run(ExtractWordsKernel{reduce_table, entries, out, count}));
  MR_TRY(w.copy(lens_mapped, lens, (2 * n + 2) * sizeof(unsigned long long)));
  res->sent_bytes = sent_bytes(lens_host, w);
  if (lens_host[2 * n] != 0) {
    res->check = "failed: " + std::to_string(lens_host[2 * n]) + " words too long or a full table";
    return res->status = -EIO;
  }
  if (o.check) {
    const std::vector<uint64_t> ref = reference_word_counts(o.seed, chunks, cdf);
    const std::string why = check_words(out_host, lens_host[2 * n + 1], ref, unsigned(r), unsigned(n));
    res->check = why.empty() ? "ok: " + std::to_string(lens_host[2 * n + 1]) + " words" : "failed: " + why;
    if (!why.empty()) res->status = -EIO;
  }
  return res->status;
}

int kmeans(Worker &w, const Options &o, Result *res) {
  const int r = w.rank(), n = w.ranks();
  const unsigned k = o.k;
  const uint64_t first = o.points * r / n, mine = o.points * (r + 1) / n - first;
  const uint64_t region = 4096;  // kMaxK records of either kind
  long long *centroids_host = nullptr;
  unsigned long long *lens_host = nullptr;
  long long *centroids_mapped = w.alloc<long long>(size_t(k) * kDims, true, &centroids_host);
  long long *centroids = w.alloc<long long>(size_t(k) * kDims);
  Point *points = w.alloc<Point>(mine);
  unsigned long long *partials = w.alloc<unsigned long long>(size_t(k) * (1 + kDims));
  uint8_t *send = w.alloc<uint8_t>(n * region), *gather = w.alloc<uint8_t>(n * region);
  uint8_t *recv = w.alloc<uint8_t>(n * region);
  unsigned long long *lens = w.alloc<unsigned long long>(3 * n);  // send, gather, recv
  unsigned long long *lens_mapped = w.alloc<unsigned long long>(3 * n, true, &lens_host);
  if (!centroids_mapped || !centroids || !points || !partials || !send || !gather || !recv || !lens || !lens_mapped)
    return res->status = -ENOMEM;
  unsigned long long *send_len = lens, *gather_len = lens + n, *recv_len = lens + 2 * n;
  for (unsigned c = 0; c < k; ++c)
    for (unsigned d = 0; d < kDims; ++d) centroids_host[c * kDims + d] = initial_centroid(o.seed, k, c, d);
  MR_TRY(w.copy(centroids, centroids_mapped, size_t(k) * kDims * sizeof(long long)));
  MR_TRY(w.run(GeneratePointsKernel{points, mine, first, o.seed, k}));
  res->input_bytes = mine * sizeof(Point);

  MR_TRY(w.barrier());
  const auto t0 = Clock::now();
  for (unsigned it = 0; it < o.iterations; ++it) {
    const auto a = Clock::now();
    MR_TRY(w.run(AssignKernel{points, mine, centroids, k, partials}));
    const auto b = Clock::now();
    MR_TRY(w.run(PackPartialsKernel{partials, k, unsigned(n), send, region, send_len}, 1));
    MR_TRY(w.exchange(send, send_len, recv, recv_len, region));
    const auto c = Clock::now();
    MR_TRY(w.run(
        ReduceCentroidsKernel{w.regions(send, send_len, recv, recv_len, region), centroids, k, gather, gather_len}, 1));
    const auto d = Clock::now();
    MR_TRY(w.exchange(gather, gather_len, recv, recv_len, region));
    const auto e = Clock::now();
    MR_TRY(w.run(ApplyCentroidsKernel{w.regions(gather, gather_len, recv, recv_len, region), centroids, k}, 1));
    res->map_s += std::chrono::duration<double>(b - a).count();
    res->shuffle_s += std::chrono::duration<double>((c - b) + (e - d)).count();
    res->reduce_s += std::chrono::duration<double>((d - c) + (Clock::now() - e)).count();
    MR_TRY(w.copy(lens_mapped, lens, 3 * n * sizeof(unsigned long long)));
    res->sent_bytes += sent_bytes(lens_host, w) + sent_bytes(lens_host + n, w);
  }
  MR_TRY(w.barrier());
  res->total_s = since(t0);

  MR_TRY(w.copy(centroids_mapped, centroids, size_t(k) * kDims * sizeof(long long)));
  if (o.check) {
    const std::vector<int64_t> ref = reference_kmeans(o.seed, o.points, k, o.iterations);
    res->check = "ok: " + std::to_string(k) + " centroids";
    for (unsigned i = 0; i < k * kDims; ++i)
      if (centroids_host[i] != ref[i]) {
        res->check = "failed: centroid " + std::to_string(i / kDims) + " coordinate " + std::to_string(i % kDims) +
                     ": " + std::to_string(centroids_host[i]) + ", expected " + std::to_string(ref[i]);
        return res->status = -EIO;
      }
  }
  return res->status;
}

std::mutex g_print;

void report(const Options &o, int rank, const char *backend, const std::string &transport, const Result &r) {
  char line[1024];
  std::snprintf(line, sizeof line,
                "{\"label\": \"%s\", \"job\": \"%s\", \"ranks\": %d, \"rank\": %d, \"mode\": \"%s\", \"backend\": "
                "\"%s\", \"transport\": \"%s\", \"input_bytes\": %" PRIu64 ", \"sent_bytes\": %" PRIu64
                ", \"total_s\": %.6f, \"map_s\": %.6f, \"shuffle_s\": %.6f, \"reduce_s\": %.6f, \"status\": \"%s\", "
                "\"check\": \"%s\"}",
                o.label.c_str(), o.job.c_str(), o.ranks, rank, o.rank >= 0 ? "processes" : "threads", backend,
                transport.c_str(), r.input_bytes, r.sent_bytes, r.total_s, r.map_s, r.shuffle_s, r.reduce_s,
                r.status < 0 ? gs_status_name(r.status) : "ok", r.check.c_str());
  std::lock_guard<std::mutex> lock(g_print);
  std::printf("%s\n", line);
  std::fflush(stdout);
  if (!o.json.empty())
    if (FILE *f = std::fopen(o.json.c_str(), "a")) {
      std::fprintf(f, "%s\n", line);
      std::fclose(f);
    }
}

std::vector<std::string> split(const std::string &text, char sep) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t next; (next = text.find(sep, at)) != std::string::npos; at = next + 1)
    parts.push_back(text.substr(at, next - at));
  parts.push_back(text.substr(at));
  return parts;
}

bool parse(int argc, char **argv, Options *o) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const bool flag = k == "--host-backend" || k == "--no-check";
    if (!flag && i + 1 >= argc) return false;
    const char *v = flag ? "" : argv[++i];
    if (k == "--job") o->job = v;
    else if (k == "--gpus") o->gpus = std::atoi(v);
    else if (k == "--rank") o->rank = std::atoi(v);
    else if (k == "--ranks") o->ranks = std::atoi(v);
    else if (k == "--gpu") o->gpu = std::atoi(v);
    else if (k == "--port") o->port = std::atoi(v);
    else if (k == "--addr") o->addr = v;
    else if (k == "--hosts") o->hosts = split(v, ',');
    else if (k == "--corpus-mib") o->corpus_mib = std::strtoull(v, nullptr, 0);
    else if (k == "--vocabulary") o->vocabulary = static_cast<uint32_t>(std::strtoul(v, nullptr, 0));
    else if (k == "--zipf") o->zipf = std::atof(v);
    else if (k == "--points") o->points = std::strtoull(v, nullptr, 0);
    else if (k == "--k") o->k = static_cast<unsigned>(std::atoi(v));
    else if (k == "--iterations") o->iterations = static_cast<unsigned>(std::atoi(v));
    else if (k == "--seed") o->seed = std::strtoull(v, nullptr, 0);
    else if (k == "--blocks") o->blocks = static_cast<unsigned>(std::atoi(v));
    else if (k == "--threads") o->threads = static_cast<unsigned>(std::atoi(v));
    else if (k == "--label") o->label = v;
    else if (k == "--json") o->json = v;
    else if (k == "--host-backend") o->host_backend = true;
    else if (k == "--no-check") o->check = false;
    else return false;
  }
  if (o->rank < 0) o->ranks = o->gpus;
  return (o->job == "wordcount" || o->job == "kmeans") && (o->hosts.empty() || int(o->hosts.size()) == o->ranks) &&
         o->ranks >= 1 && o->ranks <= kMaxRanks && o->rank < o->ranks && o->k >= 1 && o->k <= kMaxK &&
         o->vocabulary >= 1 && o->vocabulary <= 26u * 26 * 26 * 26;
}

}  // namespace
}  // namespace mr

int main(int argc, char **argv) {
  using namespace mr;
  Options o;
  if (!parse(argc, argv, &o)) {
    std::fprintf(
        stderr,
        "usage: mapreduce --job wordcount|kmeans [--gpus N | --rank R --ranks N [--gpu I]] [--port P] "
        "[--addr A | --hosts A0,A1,...] [--corpus-mib M] [--vocabulary V] [--zipf S] [--points N] [--k K (<= %u)] "
        "[--iterations I] [--seed S] [--blocks B] [--threads T] [--host-backend] [--no-check] [--label L] "
        "[--json FILE]\n",
        kMaxK);
    return 2;
  }
  GpuSetOptions options;
  options.backend = o.host_backend ? Backend::kHost : choose_backend(false);
  const bool gpu = options.backend == Backend::kCuda;
  if (!o.corpus_mib) o.corpus_mib = gpu ? 1024 : 8;
  if (!o.points) o.points = gpu ? (16u << 20) : 100000;
  const bool processes = o.rank >= 0;
  options.count = processes ? 1 : o.ranks;
  options.first = processes ? (o.gpu >= 0 ? o.gpu : o.rank) : std::max(o.gpu, 0);
  options.share = true;
  options.proxy.quiet = true;
  if (gpu) options.proxy.busy_poll_us = -1;
  std::unique_ptr<GpuSet> gpus;
  if (int rc = GpuSet::start(options, &gpus); rc < 0) {
    std::fprintf(stderr, "mapreduce: no GPUs to run on: %s\n", gs_status_name(rc));
    return 1;
  }
  std::fprintf(stderr, "mapreduce: %s, %d worker%s (%s), %s backend; %s\n", o.job.c_str(), o.ranks,
               o.ranks == 1 ? "" : "s", processes ? "one per process" : "threads of one process",
               backend_name(gpus->backend()), gpus->proxy(0).placement().c_str());
  std::vector<Result> results(processes ? 1 : o.ranks);
  auto work = [&](int index) {
    const int rank = processes ? o.rank : index;
    Worker w(*gpus, index, rank, o);
    Result &res = results[index];
    int rc = w.mesh_up();
    if (rc < 0) res.status = rc;
    else o.job == "wordcount" ? word_count(w, o, &res) : kmeans(w, o, &res);
    if (res.status == 0) w.mesh_down();
    else gpus->proxy(index).request_kernel_stop();
    gpus->proxy(index).kernel_exited(res.status < 0 ? -EIO : 0);
    report(o, rank, backend_name(gpus->backend()), gpus->proxy(index).transport(), res);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < int(results.size()); ++i) threads.emplace_back(work, i);
  for (auto &t : threads) t.join();
  gpus->stop();
  for (const Result &r : results)
    if (r.status < 0) return 1;
  return 0;
}
