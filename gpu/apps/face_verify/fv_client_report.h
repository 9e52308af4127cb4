// The load generator's bookkeeping: every reply checked against the
// reference, latencies, the one-line summary and the JSON report that
// scripts/face-verify reads.
#ifndef FV_CLIENT_REPORT_H
#define FV_CLIENT_REPORT_H

#include "fv_wire.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace fv {

enum class Expect {
  kExact,                // every reply equals the reference
  kAllowDatabaseErrors,  // ... or is a "database" error (memcached outage tests)
  kDatabaseErrors,       // every reply is a "database" error (memcached is down)
};

struct RunInfo {
  std::string label;
  const char *mode;  // "closed" or "open"
  int conns;
  double rate;
  uint32_t width, height;
};

struct Tally {
  uint64_t replies = 0, verdicts[4] = {}, database_errors = 0, wrong = 0;
  std::vector<uint64_t> latencies;  // ns, replies inside the measured window
  double seconds = 0;
  double client_cores_busy = 0;  // the client process's CPU seconds per second of its run
  int client_cores = 0;          // the cores it may run on
  bool failed = false;
  std::string why, first_wrong;

  void fail(const std::string &what) {
    if (!failed) why = what;
    failed = true;
  }

  // latency_ns ~0: outside the measured window.
  void check(const uint8_t *bytes, const Reply &expect, Expect mode, uint64_t latency_ns) {
    Reply got{};
    if (!decode_reply(bytes, &got)) {
      note_wrong("undecodable reply");
      return;
    }
    ++replies;
    ++verdicts[got.verdict];
    const bool db = got.verdict == kError && got.reason == kDatabase;
    database_errors += db;
    const bool same = got.verdict == expect.verdict && got.reason == expect.reason &&
                      got.request_id == expect.request_id && got.chi2_q16 == expect.chi2_q16 && got.bins == expect.bins;
    const bool right = mode == Expect::kExact                 ? same
                       : mode == Expect::kAllowDatabaseErrors ? same || (db && got.request_id == expect.request_id)
                                                              : db && got.request_id == expect.request_id;
    if (!right) {
      char what[256];
      std::snprintf(what, sizeof what, "request %llu: got %s/%s chi2 %llu bins %u, expected %s/%s chi2 %llu bins %u",
                    (unsigned long long)got.request_id, verdict_name(got.verdict), reason_name(got.reason),
                    (unsigned long long)got.chi2_q16, got.bins, verdict_name(expect.verdict),
                    reason_name(expect.reason), (unsigned long long)expect.chi2_q16, expect.bins);
      note_wrong(what);
    }
    if (latency_ns != ~0ull) latencies.push_back(latency_ns);
  }

  void merge(Tally &&o) {
    replies += o.replies;
    for (int i = 0; i < 4; ++i) verdicts[i] += o.verdicts[i];
    database_errors += o.database_errors;
    if (wrong == 0 && o.wrong) first_wrong = o.first_wrong;
    wrong += o.wrong;
    latencies.insert(latencies.end(), o.latencies.begin(), o.latencies.end());
    if (o.failed) fail(o.why);
  }

  bool ok(uint64_t requests) const { return !failed && wrong == 0 && (requests == 0 || replies == requests); }

  double throughput() const { return seconds > 0 ? double(latencies.size()) / seconds : 0; }

  // The p-quantile in µs (sorted latencies).
  double quantile_us(double p) const {
    if (latencies.empty()) return 0;
    const size_t i = std::min(latencies.size() - 1, size_t(p * double(latencies.size())));
    return double(latencies[i]) / 1e3;
  }

  void print_summary(const RunInfo &info) {
    std::sort(latencies.begin(), latencies.end());
    std::printf(
        "fv_client[%s]: %s loop, %d conns, %ux%u: %llu replies, %.0f req/s over %.2f s; latency us p50 %.1f "
        "p99 %.1f p99.9 %.1f max %.1f; match %llu no-match %llu unknown %llu error %llu (database %llu); "
        "wrong %llu; client cores busy %.2f of %d\n",
        info.label.c_str(), info.mode, info.conns, info.width, info.height, (unsigned long long)replies, throughput(),
        seconds, quantile_us(0.5), quantile_us(0.99), quantile_us(0.999), quantile_us(1.0),
        (unsigned long long)verdicts[0], (unsigned long long)verdicts[1], (unsigned long long)verdicts[2],
        (unsigned long long)verdicts[3], (unsigned long long)database_errors, (unsigned long long)wrong,
        client_cores_busy, client_cores);
    if (wrong) std::printf("fv_client[%s]: first wrong reply: %s\n", info.label.c_str(), first_wrong.c_str());
    if (failed) std::printf("fv_client[%s]: FAILED: %s\n", info.label.c_str(), why.c_str());
    std::fflush(stdout);
  }

  // Call after print_summary (latencies sorted).
  bool write_json(const std::string &path, const RunInfo &info) const {
    FILE *f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    std::fprintf(f,
                 "{\"label\": \"%s\", \"mode\": \"%s\", \"conns\": %d, \"rate\": %.1f, \"width\": %u, \"height\": %u,\n"
                 " \"replies\": %llu, \"measured\": %zu, \"seconds\": %.4f, \"throughput\": %.1f,\n"
                 " \"latency_us\": {\"p50\": %.2f, \"p90\": %.2f, \"p99\": %.2f, \"p999\": %.2f, \"max\": %.2f},\n"
                 " \"verdicts\": {\"match\": %llu, \"no_match\": %llu, \"unknown_identity\": %llu, \"error\": %llu},\n"
                 " \"database_errors\": %llu, \"wrong\": %llu, \"ok\": %s,\n"
                 " \"client_cores_busy\": %.3f, \"client_cores\": %d,\n \"cdf_us\": [",
                 info.label.c_str(), info.mode, info.conns, info.rate, info.width, info.height,
                 (unsigned long long)replies, latencies.size(), seconds, throughput(), quantile_us(0.5),
                 quantile_us(0.9), quantile_us(0.99), quantile_us(0.999), quantile_us(1.0),
                 (unsigned long long)verdicts[0], (unsigned long long)verdicts[1], (unsigned long long)verdicts[2],
                 (unsigned long long)verdicts[3], (unsigned long long)database_errors, (unsigned long long)wrong,
                 ok(0) ? "true" : "false", client_cores_busy, client_cores);
    // The latency distribution: 1% steps, then finer towards the tail.
    std::vector<double> ps;
    for (int i = 0; i < 99; ++i) ps.push_back(i / 100.0);
    for (int i = 990; i < 1000; ++i) ps.push_back(i / 1000.0);
    for (int i = 9990; i <= 10000; ++i) ps.push_back(i / 10000.0);
    for (size_t i = 0; i < ps.size(); ++i) std::fprintf(f, "%s[%.4f, %.2f]", i ? ", " : "", ps[i], quantile_us(ps[i]));
    std::fprintf(f, "]}\n");
    return std::fclose(f) == 0;
  }

 private:
  void note_wrong(const std::string &what) {
    if (wrong++ == 0) first_wrong = what;
  }
};

}  // namespace fv

#endif
