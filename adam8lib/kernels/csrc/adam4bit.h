#pragma once

#include "adam8bit.h"

// =============================================================================================
// The 4-bit formats ("4bit", "4bit-naive"; adam8lib/kernels/cpu_formats.py): the 8-bit kernel's
// tiles and per-element maths (update_moments, update_param, nearest_code, Sqrt, and their AVX2
// twins: one spec, one rounding), with two 4-bit codes per byte (element 2i in the high nibble,
// 2i + 1 in the low one; an odd count leaves code 0 in the last low nibble, as
// formats.pack_nibbles pads). Each tile unpacks its codes to one per byte, steps, packs them again.
// * m, and v of a vector (rows = 0): blockwise, so the tile is exactly the 8-bit step_tile (with
//   its AVX2/AVX-512 loops) on the unpacked codes, with the 4-bit maps and tables.
// * v of a matrix (rows x cols): rank-1 scales, v's scale at (r, c) = min(row max r, column max c)
//   of |v|, stored as the rows' maxima then the columns'. The new maxima must be known before
//   any v is coded, so the step makes two passes: pass A computes every new m and v (not stored)
//   and reduces the row and column maxima (each thread its own, then the threads' in order);
//   pass B recomputes the same values (tile_moments: the same operations, the same bits) and
//   does the step, decoding with the old maxima (copied first) and coding v with 1/scale per
//   element (AVX2 loops on the 8-bit helpers, scalar tails).
// Tensors of three or more dimensions (rank-1 over every axis) never come here: cpu_formats.py
// runs the reference step for them.
// =============================================================================================
namespace {

struct Step4 {
  void* p;
  const void* g;
  uint8_t* s1;
  uint8_t* s2;
  float* absmax1;        // m: one per block (old in, new out)
  float* absmax2;        // v: one per block, or rows + cols maxima (new out)
  const float* old2;     // v's old scales (rank-1: a copy of absmax2; blockwise: absmax2 itself)
  int64_t n, blocksize, rows, cols;  // rows = 0: v blockwise
  CodeTable t1, t2;
  Hyper h;
  const Maps* maps;  // t1, t2 in every form the 8-bit loops use
  int simd;
};

// per-thread scratch for one tile (whole blocks, at most kMaxBlocksize elements)
struct Buffers4 : Buffers {
  alignas(64) float scale[kMaxBlocksize];  // v's scale of each element (pass 1), then 1/scale (pass 2)
  alignas(64) uint8_t c1[kMaxBlocksize];
  alignas(64) uint8_t c2[kMaxBlocksize];
};

// v's rank-1 scales min(row max, column max) of the elements [start, start + len), walking
// the row and column (no division per element); inverse: 1/scale (0 for a scale of 0), as the reference
template <bool Inverse>
void rank1_scales(const float* maxima, int64_t rows, int64_t cols, int64_t start, int64_t len, float* out) {
  int64_t r = start / cols, c = start % cols;
  for (int64_t k = 0; k < len;) {
    const float row = maxima[r];
    const int64_t run = std::min(len - k, cols - c);
    const float* col = maxima + rows + c;
    for (int64_t j = 0; j < run; ++j) {
      const float scale = std::min(row, col[j]);
      out[k + j] = Inverse ? (scale > 0.0f ? 1.0f / scale : 0.0f) : scale;
    }
    k += run;
    ++r;
    c = 0;
  }
}

// two codes per byte -> one per byte (element 2i from the high nibble); len is even, or the tensor's end
inline void unpack4(const uint8_t* __restrict packed, int64_t len, uint8_t* __restrict codes) {
  for (int64_t k = 0; k < len / 2; ++k) {
    codes[2 * k] = packed[k] >> 4;
    codes[2 * k + 1] = packed[k] & 0x0f;
  }
  if (len & 1) codes[len - 1] = packed[len / 2] >> 4;
}
inline void pack4(const uint8_t* __restrict codes, int64_t len, uint8_t* __restrict packed) {
  for (int64_t k = 0; k < len / 2; ++k) packed[k] = static_cast<uint8_t>(codes[2 * k] << 4 | codes[2 * k + 1]);
  if (len & 1) packed[len / 2] = static_cast<uint8_t>(codes[len - 1] << 4);  // pad: code 0, as pack_nibbles
}

// rank-1 v: the new m and v of the tile [start, start + len) into buf (non-finite rule applied; a
// reset v is the -0.0 mark), and the m blocks' new maxima of |m| into max1 (and of |v| into max2,
// unused); nothing stored: pass A and the step both call this, and get the same bits
template <typename G, bool Fused>
void tile_moments(const Step4& a, int64_t start, int64_t len, Buffers4& buf, float* max1, float* max2) {
  const G* g = static_cast<const G*>(a.g) + start;
  const int64_t bs = a.blocksize, b0 = start / bs;
  unpack4(a.s1 + start / 2, len, buf.c1);
  unpack4(a.s2 + start / 2, len, buf.c2);
  rank1_scales<false>(a.old2, a.rows, a.cols, start, len, buf.scale);
  for (int64_t lo = 0, b = 0; lo < len; lo += bs, ++b) {
    const int64_t hi = std::min(len, lo + bs);
    const float old1 = a.absmax1[b0 + b];
    float top1 = 0.0f, top2 = 0.0f;
    int64_t k = lo;
#if ADAM8_AVX2
    if (a.simd != kScalar) {  // the 8-bit kernel's AVX2 step, with v's scale per element
      const __m256 vold1 = _mm256_set1_ps(old1), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
      __m256 vmax1 = _mm256_setzero_ps(), vmax2 = _mm256_setzero_ps();
      for (; k + 8 <= hi; k += 8) {
        __m256 m, v;
        const __m256 q1 = _mm256_i32gather_ps(a.t1.qmap, load_codes8(buf.c1 + k), 4);
        const __m256 q2 = _mm256_i32gather_ps(a.t2.qmap, load_codes8(buf.c2 + k), 4);
        update_moments8<Fused>(load8(g + k), q1, q2, vold1, _mm256_load_ps(buf.scale + k), a.h, m, v);
        _mm256_store_ps(buf.m + k, m);
        _mm256_store_ps(buf.v + k, v);
        vmax1 = _mm256_max_ps(_mm256_and_ps(m, abs_mask), vmax1);
        vmax2 = _mm256_max_ps(_mm256_and_ps(v, abs_mask), vmax2);
      }
      top1 = max8(vmax1);
      top2 = max8(vmax2);
    }
#endif
    for (; k < hi; ++k) {
      update_moments<Fused>(to_float(g[k]), buf.c1[k], buf.c2[k], old1, buf.scale[k], a.t1, a.t2, a.h, buf.m[k],
                            buf.v[k]);
      top1 = std::max(top1, std::fabs(buf.m[k]));
      top2 = std::max(top2, std::fabs(buf.v[k]));
    }
    max1[b] = top1;
    max2[b] = top2;
  }
}

constexpr int64_t kBlocksPerTile4 = kMaxBlocksize / 64;  // blocks are at least 64 elements

inline int64_t tile4(int64_t blocksize) { return std::max<int64_t>(1, kTile / blocksize) * blocksize; }

// pass A of a rank-1 step: the new row and column maxima of |v| over the tile [start, start + len)
template <typename G, bool Fused>
void rank1_maxima(const Step4& a, int64_t start, int64_t len, Buffers4& buf, float* row_max, float* col_max) {
  float max1[kBlocksPerTile4], max2[kBlocksPerTile4];
  tile_moments<G, Fused>(a, start, len, buf, max1, max2);
  int64_t r = start / a.cols, c = start % a.cols;
  for (int64_t k = 0; k < len;) {  // runs of one row
    const int64_t run = std::min(len - k, a.cols - c);
    float top = row_max[r];
    float* __restrict cm = col_max + c;
    const float* __restrict v = buf.v + k;
    for (int64_t j = 0; j < run; ++j) {
      const float av = std::fabs(v[j]);
      top = std::max(top, av);
      cm[j] = std::max(cm[j], av);
    }
    row_max[r] = top;
    k += run;
    ++r;
    c = 0;
  }
}

// pass B: the step on the tile [start, start + len) of whole blocks. Blockwise v: the 8-bit
// kernel's tile (step_tile, with its SIMD loops) on the tile's codes unpacked to one per byte.
template <typename P, typename G, bool Fused>
void step4_tile(const Step4& a, int64_t start, int64_t len, const Sqrt& sqrt_of, Buffers4& buf) {
  P* p = static_cast<P*>(a.p) + start;
  if (a.rows == 0) {
    const int64_t b0 = start / a.blocksize;
    unpack4(a.s1 + start / 2, len, buf.c1);
    unpack4(a.s2 + start / 2, len, buf.c2);
    step_tile<P, G, Fused, true>(p, static_cast<const G*>(a.g) + start, buf.c1, buf.c2, a.absmax1 + b0, a.absmax2 + b0,
                                 len, a.blocksize, *a.maps, a.h, sqrt_of, buf, a.simd);
    pack4(buf.c1, len, a.s1 + start / 2);
    pack4(buf.c2, len, a.s2 + start / 2);
    return;
  }
  const int64_t bs = a.blocksize, b0 = start / bs;
  float max1[kBlocksPerTile4], max2[kBlocksPerTile4];
  tile_moments<G, Fused>(a, start, len, buf, max1, max2);
  sqrt_of(buf.v, buf.sqrt_v, len);
  rank1_scales<true>(a.absmax2, a.rows, a.cols, start, len, buf.scale);  // 1/scale from the new maxima
  for (int64_t lo = 0, b = 0; lo < len; lo += bs, ++b) {
    const int64_t hi = std::min(len, lo + bs);
    a.absmax1[b0 + b] = max1[b];  // (the old scales were read in tile_moments)
    const float inv1 = max1[b] > 0.0f ? 1.0f / max1[b] : 0.0f;
    int64_t k = lo;
#if ADAM8_AVX2
    if (a.simd != kScalar) {  // the 8-bit kernel's AVX2 pass 2, with v's 1/scale per element
      const __m256 vinv1 = _mm256_set1_ps(inv1);
      for (; k + 8 <= hi; k += 8) {
        const __m256 m = _mm256_load_ps(buf.m + k), v = _mm256_load_ps(buf.v + k);
        store8(p + k, update_param8<true>(load8(p + k), m, v, _mm256_load_ps(buf.sqrt_v + k), a.h));
        store_codes8(buf.c1 + k, nearest_code8(_mm256_mul_ps(m, vinv1), a.t1));
        store_codes8(buf.c2 + k, nearest_code8(_mm256_mul_ps(v, _mm256_load_ps(buf.scale + k)), a.t2));
      }
    }
#endif
    for (; k < hi; ++k) {
      p[k] = from_float<P>(update_param<true>(to_float(p[k]), buf.m[k], buf.v[k], buf.sqrt_v[k], a.h));
      buf.c1[k] = nearest_code(buf.m[k] * inv1, a.t1);
      buf.c2[k] = nearest_code(buf.v[k] * buf.scale[k], a.t2);
    }
  }
  pack4(buf.c1, len, a.s1 + start / 2);
  pack4(buf.c2, len, a.s2 + start / 2);
}

template <typename P, typename G, bool Fused>
void step4(const Step4& a, const Sqrt& sqrt_of, int team) {
  const int64_t tile = tile4(a.blocksize), tiles = (a.n + tile - 1) / tile;
  if (a.rows != 0) {  // pass A: the new rank-1 maxima, into absmax2 (the old ones are in a.old2)
    const int64_t rc = a.rows + a.cols;
    std::vector<float> maxima(static_cast<size_t>(team * rc), 0.0f);
#pragma omp parallel num_threads(team)
    {
      Buffers4 buf;
#ifdef _OPENMP
      float* mine = maxima.data() + static_cast<int64_t>(omp_get_thread_num()) * rc;
#else
      float* mine = maxima.data();
#endif
#pragma omp for schedule(dynamic, 4)
      for (int64_t k = 0; k < tiles; ++k) {
        rank1_maxima<G, Fused>(a, k * tile, std::min(tile, a.n - k * tile), buf, mine, mine + a.rows);
      }
    }
    for (int64_t k = 0; k < rc; ++k) {
      float best = 0.0f;
      for (int t = 0; t < team; ++t) best = std::max(best, maxima[static_cast<size_t>(t * rc + k)]);
      a.absmax2[k] = best;
    }
  }
#pragma omp parallel num_threads(team)
  {
    Buffers4 buf;
#pragma omp for schedule(dynamic, 4)
    for (int64_t k = 0; k < tiles; ++k) {
      step4_tile<P, G, Fused>(a, k * tile, std::min(tile, a.n - k * tile), sqrt_of, buf);
    }
  }
}

template <typename P, typename G>
void step4_dispatch(const Step4& a, bool fused, const Sqrt& sqrt_of, int team) {
  if (fused) {
    step4<P, G, true>(a, sqrt_of, team);
  } else {
    step4<P, G, false>(a, sqrt_of, team);
  }
}
}  // namespace
