// Word count kernels. Each GPU generates its share of the corpus in its
// memory (GenerateCorpusKernel), maps it into a hash table of (word, count)
// (MapWordsKernel: tokenize, FNV-1a, insert with atomics: the combiner),
// packs the table's entries by reducer (PackWordsKernel), and after the
// shuffle merges what every GPU sent it into its reduce table
// (MergeWordsKernel); ExtractWordsKernel hands the result to the host.
#pragma once

#include "mr_data.h"
#include "mr_exchange.cuh"

#include <gpusock/gpu.cuh>

#include <stdint.h>

namespace mr {

// A table entry and a shuffled record alike: 32 bytes.
struct WordEntry {
  unsigned long long key;  // FNV-1a 64 of the word, 0 = empty (a zero hash counts as 1)
  unsigned long long count;
  char word[kMaxWord];  // not terminated when 16 bytes long
};
static_assert(sizeof(WordEntry) == 32, "records are 32 bytes");

GS_HD unsigned long long word_key(uint64_t hash) { return hash ? hash : 1; }

// Adds `count` for a word to an open-addressing table of mask + 1 entries.
// False when the table is full.
GS_HD bool table_add(WordEntry *table, uint64_t mask, unsigned long long key, const char *word, unsigned len,
                     unsigned long long count) {
  uint64_t i = key & mask;
  for (uint64_t probes = 0; probes <= mask; ++probes, i = (i + 1) & mask) {
    const unsigned long long found = gpusock::prim::atomic_cas(&table[i].key, 0ull, key);
    if (found == 0) {  // ours: the word is read only after this kernel
      for (unsigned c = 0; c < len && c < kMaxWord; ++c) table[i].word[c] = word[c];
    } else if (found != key) {
      continue;
    }
    gpusock::prim::atomic_add(&table[i].count, count);
    return true;
  }
  return false;
}

// The corpus: chunk c of this GPU's share is global chunk first + c.
struct GenerateCorpusKernel {
  uint8_t *text;
  uint64_t chunks, first, seed;
  const uint32_t *cdf;
  uint32_t vocabulary;
  GS_HD void operator()() const {
    for (uint64_t c = global_thread(); c < chunks; c += grid_threads()) {
      uint8_t *out = text + c * kChunkBytes;
      for (unsigned i = 0; i < kChunkBytes; ++i) out[i] = ' ';
      chunk_words(seed, first + c, cdf, vocabulary, [&](uint32_t, const char *w, unsigned len, unsigned at) {
        for (unsigned i = 0; i < len; ++i) out[at + i] = static_cast<uint8_t>(w[i]);
      });
    }
  }
};

// One thread per chunk: words are runs of non-spaces.
struct MapWordsKernel {
  const uint8_t *text;
  uint64_t chunks;
  WordEntry *table;
  uint64_t mask;
  unsigned long long *errors;  // GPU memory: words too long, table full
  GS_HD void operator()() const {
    for (uint64_t c = global_thread(); c < chunks; c += grid_threads()) {
      const uint8_t *in = text + c * kChunkBytes;
      char word[kMaxWord];
      unsigned len = 0;
      uint64_t h = gpusock::test::kFnvOffset;  // FNV-1a as fnv1a64, a byte at a time
      for (unsigned i = 0; i <= kChunkBytes; ++i) {
        const uint8_t ch = i < kChunkBytes ? in[i] : ' ';
        if (ch != ' ') {
          if (len < kMaxWord) word[len] = static_cast<char>(ch);
          h = (h ^ ch) * gpusock::test::kFnvPrime;
          ++len;
          continue;
        }
        if (len == 0) continue;
        if (len > kMaxWord || !table_add(table, mask, word_key(h), word, len, 1))
          gpusock::prim::atomic_add(errors, 1ull);
        len = 0;
        h = gpusock::test::kFnvOffset;
      }
    }
  }
};

// Every entry goes to region owner(key) of `send` (region bytes each);
// send_len[d] (GPU memory, zero before) counts the bytes.
struct PackWordsKernel {
  const WordEntry *table;
  uint64_t entries;
  uint8_t *send;
  uint64_t region;
  unsigned long long *send_len;
  unsigned ranks;
  GS_HD void operator()() const {
    for (uint64_t i = global_thread(); i < entries; i += grid_threads()) {
      if (table[i].key == 0) continue;
      const unsigned d = owner_of_word(table[i].key, ranks);
      const unsigned long long at = gpusock::prim::atomic_add(send_len + d, 32ull);
      *reinterpret_cast<WordEntry *>(send + d * region + at) = table[i];
    }
  }
};

// Merges the records of every source: this GPU's own region of `send` and
// the regions other GPUs sent into `recv`.
struct MergeWordsKernel {
  Regions in;
  WordEntry *table;
  uint64_t mask;
  unsigned long long *errors;
  GS_HD void operator()() const {
    for (int s = 0; s < in.ranks; ++s) {
      const uint64_t n = in.bytes(s) / sizeof(WordEntry);
      const WordEntry *records = reinterpret_cast<const WordEntry *>(in.from(s));
      for (uint64_t i = global_thread(); i < n; i += grid_threads()) {
        const WordEntry &e = records[i];
        unsigned len = 0;
        while (len < kMaxWord && e.word[len]) ++len;
        if (!table_add(table, mask, e.key, e.word, len, e.count)) gpusock::prim::atomic_add(errors, 1ull);
      }
    }
  }
};

// The table's entries, packed into `out` (host-mapped); *count (GPU memory) how many.
struct ExtractWordsKernel {
  const WordEntry *table;
  uint64_t entries;
  WordEntry *out;
  unsigned long long *count;
  GS_HD void operator()() const {
    for (uint64_t i = global_thread(); i < entries; i += grid_threads()) {
      if (table[i].key == 0) continue;
      out[gpusock::prim::atomic_add(count, 1ull)] = table[i];
    }
  }
};

}  // namespace mr
