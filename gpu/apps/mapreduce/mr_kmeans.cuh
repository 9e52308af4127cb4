// K-means kernels, one iteration: every GPU assigns its points to the nearest
// centroid and sums them per cluster (AssignKernel: the map, with a per-thread
// combiner), packs each cluster's partial sum for the cluster's reducer
// (PackPartialsKernel), and after the shuffle a reducer adds the partials of
// its clusters and sends the new centroids to every GPU (ReduceCentroidsKernel,
// then a second exchange), which all take them (ApplyCentroidsKernel).
#pragma once

#include "mr_data.h"
#include "mr_exchange.cuh"

#include <gpusock/gpu.cuh>

#include <stdint.h>

namespace mr {

// A cluster's partial sum in the shuffle, and a centroid in the all-gather.
struct PartialRecord {
  unsigned long long cluster, count;
  long long sum[kDims];
};
struct CentroidRecord {
  unsigned long long cluster;
  long long x[kDims];
};

// Partials in GPU memory: k x (1 + kDims) unsigned long longs (count, sums;
// int64 sums kept as two's complement so atomic adds apply).
struct GeneratePointsKernel {
  Point *points;
  uint64_t count, first, seed;
  unsigned k;
  GS_HD void operator()() const {
    for (uint64_t i = global_thread(); i < count; i += grid_threads()) points[i] = make_point(seed, first + i, k);
  }
};

struct AssignKernel {
  const Point *points;
  uint64_t count;
  const long long *centroids;  // k x kDims
  unsigned k;
  unsigned long long *partials;
  GS_HD void operator()() const {
    unsigned long long n[kMaxK] = {};
    long long sum[kMaxK][kDims] = {};
    for (uint64_t i = global_thread(); i < count; i += grid_threads()) {
      const Point p = points[i];
      const unsigned c = nearest(p, reinterpret_cast<const int64_t *>(centroids), k);
      ++n[c];
      for (unsigned d = 0; d < kDims; ++d) sum[c][d] += p.x[d];
    }
    for (unsigned c = 0; c < k; ++c) {
      if (n[c] == 0) continue;
      unsigned long long *row = partials + c * (1 + kDims);
      gpusock::prim::atomic_add(row, n[c]);
      for (unsigned d = 0; d < kDims; ++d)
        gpusock::prim::atomic_add(row + 1 + d, static_cast<unsigned long long>(sum[c][d]));
    }
  }
};

// One thread: cluster c's partial into region owner(c), then zeroes the
// partials for the next iteration.
struct PackPartialsKernel {
  unsigned long long *partials;
  unsigned k, ranks;
  uint8_t *send;
  uint64_t region;
  unsigned long long *send_len;
  GS_HD void operator()() const {
    if (global_thread() != 0) return;
    for (unsigned d = 0; d < ranks; ++d) send_len[d] = 0;
    for (unsigned c = 0; c < k; ++c) {
      const unsigned d = owner_of_cluster(c, ranks);
      PartialRecord r{c, partials[c * (1 + kDims)], {}};
      for (unsigned x = 0; x < kDims; ++x) r.sum[x] = static_cast<long long>(partials[c * (1 + kDims) + 1 + x]);
      *reinterpret_cast<PartialRecord *>(send + d * region + send_len[d]) = r;
      send_len[d] += sizeof r;
      for (unsigned x = 0; x <= kDims; ++x) partials[c * (1 + kDims) + x] = 0;
    }
  }
};

// One thread: the new centroid of each cluster this GPU reduces, written into
// every region of `out` (one per GPU; not in.send, which it reads) for the
// all-gather.
struct ReduceCentroidsKernel {
  Regions in;
  const long long *centroids;
  unsigned k;
  uint8_t *out;
  unsigned long long *out_len;
  GS_HD void operator()() const {
    if (global_thread() != 0) return;
    for (int d = 0; d < in.ranks; ++d) out_len[d] = 0;
    for (unsigned c = 0; c < k; ++c) {
      if (owner_of_cluster(c, in.ranks) != unsigned(in.rank)) continue;
      long long count = 0, sum[kDims] = {};
      for (int s = 0; s < in.ranks; ++s) {
        const PartialRecord *r = reinterpret_cast<const PartialRecord *>(in.from(s));
        for (uint64_t i = 0; i < in.bytes(s) / sizeof *r; ++i) {
          if (r[i].cluster != c) continue;
          count += static_cast<long long>(r[i].count);
          for (unsigned x = 0; x < kDims; ++x) sum[x] += r[i].sum[x];
        }
      }
      CentroidRecord rec{c, {}};
      for (unsigned x = 0; x < kDims; ++x) rec.x[x] = centroid_coord(sum[x], count, centroids[c * kDims + x]);
      for (int d = 0; d < in.ranks; ++d) {
        *reinterpret_cast<CentroidRecord *>(out + d * in.region + out_len[d]) = rec;
        out_len[d] += sizeof rec;
      }
    }
  }
};

// One thread: every reducer's centroids into this GPU's table.
struct ApplyCentroidsKernel {
  Regions in;
  long long *centroids;
  unsigned k;
  GS_HD void operator()() const {
    if (global_thread() != 0) return;
    for (int s = 0; s < in.ranks; ++s) {
      const CentroidRecord *r = reinterpret_cast<const CentroidRecord *>(in.from(s));
      for (uint64_t i = 0; i < in.bytes(s) / sizeof *r; ++i)
        if (r[i].cluster < k)
          for (unsigned x = 0; x < kDims; ++x) centroids[r[i].cluster * kDims + x] = r[i].x[x];
    }
  }
};

}  // namespace mr
