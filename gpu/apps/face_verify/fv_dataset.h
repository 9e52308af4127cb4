// The deterministic data set: every image and every request follows from a
// seed, so the loader, the client and any test agree on all of them without
// storing any.
//
// - base_image(seed, id): the "face" of an identity, the same structure at any
//   size (drawn in a 256 x 256 unit square): two triangle-wave stripe fields
//   (identity's periods, directions, amplitudes), four soft blobs and a blocky
//   per-identity texture, plus a per-identity fine grain in [-12, 12] per
//   pixel. Its LBP histograms are what the loader stores.
// - probe_image(seed, id, variant): a perturbed copy of the base image: a
//   brightness shift in [-16, 16] and per-pixel noise in [-2, 2].
// - request_plan(params, index): what request `index` asks. kind by hash:
//   match_pct% genuine (probe of the claimed identity), unknown_pct% an
//   identity never loaded (ids >= identities), the rest impostors (probe of
//   another identity). Which verdict each gets is decided by the features, not
//   by the kind: the client checks every reply against the CPU reference.
#ifndef FV_DATASET_H
#define FV_DATASET_H

#include "test-support/checksum.h"

#include <stddef.h>
#include <stdint.h>

namespace fv {

using gpusock::test::mix64;  // splitmix64's finalizer
inline uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) { return mix64(mix64(mix64(a) ^ b) ^ c); }

// Draws from one identity's stream.
struct Draw {
  uint64_t state;
  uint32_t next(uint32_t lo, uint32_t hi) {  // in [lo, hi]
    state = mix64(state);
    return lo + static_cast<uint32_t>(state % (uint64_t(hi) - lo + 1));
  }
  int32_t signed_next(int32_t mag) { return static_cast<int32_t>(next(0, 2 * mag)) - mag; }
};

inline int32_t triangle(int32_t t, int32_t period) {  // 0..256..0 over one period
  int32_t m = t % period;
  if (m < 0) m += period;
  const int32_t half = period / 2;
  return (m < half ? m : period - m) * 256 / half;
}

inline void base_image(uint64_t seed, uint32_t identity, uint32_t w, uint32_t h, uint8_t *out) {
  static const int32_t dirs[8][2] = {{16, 0}, {15, 6}, {11, 11}, {6, 15}, {0, 16}, {-6, 15}, {-11, 11}, {-15, 6}};
  Draw d{hash3(seed, identity, 0xFACE)};
  int32_t period[2], amp[2], dx[2], dy[2];
  for (int s = 0; s < 2; ++s) {
    period[s] = static_cast<int32_t>(d.next(12, 44));
    amp[s] = static_cast<int32_t>(d.next(20, 50));
    const uint32_t k = d.next(0, 7);
    dx[s] = dirs[k][0];
    dy[s] = dirs[k][1];
  }
  int32_t bx[4], by[4], br[4], ba[4];
  for (int b = 0; b < 4; ++b) {
    bx[b] = static_cast<int32_t>(d.next(40, 216));
    by[b] = static_cast<int32_t>(d.next(40, 216));
    br[b] = static_cast<int32_t>(d.next(24, 64));
    ba[b] = d.signed_next(60);
  }
  const uint32_t grain = d.next(6, 14);  // texture block size (units)
  const uint64_t texture = d.state;
  for (uint32_t y = 0; y < h; ++y) {
    const int32_t v = static_cast<int32_t>(y * 256 / h);
    for (uint32_t x = 0; x < w; ++x) {
      const int32_t u = static_cast<int32_t>(x * 256 / w);
      int32_t p = 128;
      for (int s = 0; s < 2; ++s) p += amp[s] * (triangle((u * dx[s] + v * dy[s]) / 16, period[s]) - 128) / 128;
      for (int b = 0; b < 4; ++b) {
        const int32_t ex = u - bx[b], ey = v - by[b], r2 = br[b] * br[b], d2 = ex * ex + ey * ey;
        if (d2 < r2) p += ba[b] * (r2 - d2) / r2;
      }
      p += static_cast<int32_t>(hash3(texture, u / grain, v / grain) % 41) - 20;
      p += static_cast<int32_t>(mix64(texture ^ (uint64_t(y) << 32 | x)) % 25) - 12;  // fine grain
      out[size_t(y) * w + x] = static_cast<uint8_t>(p < 0 ? 0 : (p > 255 ? 255 : p));
    }
  }
}

inline void probe_image(uint64_t seed, uint32_t identity, uint64_t variant, uint32_t w, uint32_t h, uint8_t *out) {
  base_image(seed, identity, w, h, out);
  const uint64_t key = hash3(seed ^ 0x5EED, identity, variant);
  const int32_t brightness = static_cast<int32_t>(mix64(key) % 33) - 16;
  for (size_t i = 0, n = size_t(w) * h; i < n; ++i) {
    const int32_t noise = static_cast<int32_t>(hash3(key, i, 1) % 5) - 2;
    const int32_t p = out[i] + brightness + noise;
    out[i] = static_cast<uint8_t>(p < 0 ? 0 : (p > 255 ? 255 : p));
  }
}

struct DatasetParams {
  uint64_t seed = 1;
  uint32_t identities = 10000;  // ids 0 .. identities - 1 are loaded
  uint32_t match_pct = 50;
  uint32_t unknown_pct = 10;
};

enum class RequestKind : uint8_t { kGenuine, kImpostor, kUnknown };

struct RequestPlan {
  RequestKind kind;
  uint32_t claimed;  // the identity in the request
  uint32_t source;   // whose face the image shows
  uint64_t variant;  // which perturbation
};

inline RequestPlan request_plan(const DatasetParams &p, uint64_t index) {
  const uint64_t h = hash3(p.seed, index, 0x4E51);
  const uint32_t pct = static_cast<uint32_t>(h % 100);
  const uint32_t n = p.identities ? p.identities : 1;
  const uint32_t id = static_cast<uint32_t>((h >> 8) % n);
  RequestPlan r{RequestKind::kGenuine, id, id, index};
  if (pct >= p.match_pct && pct < p.match_pct + p.unknown_pct) {
    r.kind = RequestKind::kUnknown;
    r.claimed = n + static_cast<uint32_t>((h >> 40) % 1000000);  // never loaded
  } else if (pct >= p.match_pct + p.unknown_pct && n > 1) {
    r.kind = RequestKind::kImpostor;
    r.source = (id + 1 + static_cast<uint32_t>((h >> 40) % (n - 1))) % n;
  }
  return r;
}

}  // namespace fv

#endif
