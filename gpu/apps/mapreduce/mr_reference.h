// The CPU reference of both jobs, from the same generators (mr_data.h), on
// every core; and the check of one reducer's output against it.
#pragma once

#include "mr_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace mr {

// The Zipf law's cumulative shares of 2^32 for ranks 1..vocabulary, exponent s.
inline std::vector<uint32_t> zipf_cdf(uint32_t vocabulary, double s) {
  std::vector<double> w(vocabulary);
  double total = 0;
  for (uint32_t r = 0; r < vocabulary; ++r) total += w[r] = 1.0 / std::pow(double(r + 1), s);
  std::vector<uint32_t> cdf(vocabulary);
  double acc = 0;
  for (uint32_t r = 0; r < vocabulary; ++r) {
    acc += w[r];
    cdf[r] = static_cast<uint32_t>(std::min(4294967295.0, std::floor(acc / total * 4294967296.0)));
  }
  cdf[vocabulary - 1] = 0xffffffffu;
  return cdf;
}

// How often each rank occurs in chunks [0, chunks).
inline std::vector<uint64_t> reference_word_counts(uint64_t seed, uint64_t chunks, const std::vector<uint32_t> &cdf) {
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<std::vector<uint64_t>> part(threads, std::vector<uint64_t>(cdf.size()));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (uint64_t c = chunks * t / threads; c < chunks * (t + 1) / threads; ++c)
        chunk_words(seed, c, cdf.data(), static_cast<uint32_t>(cdf.size()),
                    [&](uint32_t rank, const char *, unsigned, unsigned) { ++part[t][rank]; });
    });
  for (auto &th : pool) th.join();
  for (unsigned t = 1; t < threads; ++t)
    for (size_t r = 0; r < cdf.size(); ++r) part[0][r] += part[t][r];
  return part[0];
}

// "" when the words reducer `rank` of `ranks` returned (word, count) are
// exactly the reference's words it owns, else what differs.
template <class Entry>
std::string check_words(const Entry *out, uint64_t n, const std::vector<uint64_t> &ref, unsigned rank, unsigned ranks) {
  std::vector<uint8_t> seen(ref.size());
  char text[kMaxWord];
  for (uint64_t i = 0; i < n; ++i) {
    const Entry &e = out[i];
    uint32_t r = 0;
    for (unsigned k = kWordPrefix; k-- > 0;) r = r * 26 + static_cast<uint32_t>(e.word[k] - 'a');
    const unsigned len = r < ref.size() ? word_text(r, text) : 0;
    const bool same = len > 0 && (len == kMaxWord || e.word[len] == 0) && std::equal(text, text + len, e.word);
    char why[160];
    if (!same) std::snprintf(why, sizeof why, "unknown word \"%.16s\"", e.word);
    else if (seen[r]) std::snprintf(why, sizeof why, "\"%.16s\" twice", e.word);
    else if (owner_of_word(fnv1a64(text, len), ranks) != rank)
      std::snprintf(why, sizeof why, "\"%.16s\" at the wrong reducer", e.word);
    else if (e.count != ref[r])
      std::snprintf(why, sizeof why, "\"%.16s\": %llu, expected %llu", e.word, (unsigned long long)e.count,
                    (unsigned long long)ref[r]);
    else {
      seen[r] = 1;
      continue;
    }
    return why;
  }
  for (uint32_t r = 0; r < ref.size(); ++r) {
    if (!ref[r] || seen[r]) continue;
    const unsigned len = word_text(r, text);
    if (owner_of_word(fnv1a64(text, len), ranks) != rank) continue;
    return "\"" + std::string(text, len) + "\" missing";
  }
  return "";
}

// The centroids after `iterations` rounds over points [0, count), k x kDims.
inline std::vector<int64_t> reference_kmeans(uint64_t seed, uint64_t count, unsigned k, unsigned iterations) {
  std::vector<int64_t> centroids(size_t(k) * kDims);
  for (unsigned c = 0; c < k; ++c)
    for (unsigned d = 0; d < kDims; ++d) centroids[c * kDims + d] = initial_centroid(seed, k, c, d);
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  for (unsigned it = 0; it < iterations; ++it) {
    std::vector<std::vector<int64_t>> part(threads, std::vector<int64_t>(size_t(k) * (1 + kDims)));
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (uint64_t i = count * t / threads; i < count * (t + 1) / threads; ++i) {
          const Point p = make_point(seed, i, k);
          const unsigned c = nearest(p, centroids.data(), k);
          part[t][c * (1 + kDims)] += 1;
          for (unsigned d = 0; d < kDims; ++d) part[t][c * (1 + kDims) + 1 + d] += p.x[d];
        }
      });
    for (auto &th : pool) th.join();
    for (unsigned c = 0; c < k; ++c) {
      int64_t n = 0, sum[kDims] = {};
      for (unsigned t = 0; t < threads; ++t) {
        n += part[t][c * (1 + kDims)];
        for (unsigned d = 0; d < kDims; ++d) sum[d] += part[t][c * (1 + kDims) + 1 + d];
      }
      for (unsigned d = 0; d < kDims; ++d)
        centroids[c * kDims + d] = centroid_coord(sum[d], n, centroids[c * kDims + d]);
    }
  }
  return centroids;
}

}  // namespace mr
