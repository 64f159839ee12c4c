#pragma once

// Pieces every CPU step shares, whatever its rule or state format: the SIMD levels, fp32/bf16/fp16
// elements, loads and stores of 8 (AVX2) and 16 (AVX-512) of them, byte codes in and out, the
// square root as torch computes it (IEEE, or MKL's vmsSqrt called or computed inline), and the
// mark of an element reset by the non-finite rule. Included by step_cpu.cpp (one extension).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define ADAM8_AVX2 1
#include <immintrin.h>
#else
#define ADAM8_AVX2 0
#endif
#if ADAM8_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ADAM8_AVX512 1
#else
#define ADAM8_AVX512 0
#endif

// which loops run: 0 scalar only, 1 AVX2 (8 lanes), 2 AVX-512 (16 lanes); the tail of a
// block (and any block whose scales are not finite) always goes through the scalar loop
enum Simd : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
constexpr int kBestSimd = ADAM8_AVX512 ? kAvx512 : (ADAM8_AVX2 ? kAvx2 : kScalar);

namespace {

constexpr int64_t kMaxBlocksize = 4096;

// ---- bit tricks ------------------------------------------------------------------------
inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
inline bool is_finite(float x) { return (bits_of(x) & 0x7f800000u) != 0x7f800000u; }


// ---- parameter / gradient element types: fp32, bf16 (raw bits), fp16 --------------------
struct BF16 {
  uint16_t bits;
};
inline float to_float(float x) { return x; }
inline float to_float(_Float16 x) { return static_cast<float>(x); }
inline float to_float(BF16 x) { return float_of(static_cast<uint32_t>(x.bits) << 16); }
template <typename T>
inline T from_float(float x);
template <>
inline float from_float<float>(float x) { return x; }
template <>
inline _Float16 from_float<_Float16>(float x) { return static_cast<_Float16>(x); }  // round to nearest even
template <>
inline BF16 from_float<BF16>(float x) {  // round to nearest even, NaN -> 0x7fc0, as c10::BFloat16
  const uint32_t u = bits_of(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return BF16{static_cast<uint16_t>(x != x ? 0x7fc0u : rounded)};
}

// How the exact mode gets torch's square root: by calling MKL's vmsSqrt on a buffer, or inline
// by one of the two MKL algorithms below. MKL picks its code path by CPU: its AVX-512 code on
// Intel CPUs with AVX-512, its generic SSE code on others (seen on AMD EPYC, Zen 4:
// mkl_vml_kernel_sSqrt_EXHAynn); the two round differently. cpu.py tries each against
// torch.sqrt on this machine (mkl_sqrt_inline()) and passes the one that matches, if any.
enum Root : int { kRootCall = 0, kRootAvx512 = 1, kRootSse = 2 };

#if ADAM8_AVX512
// What MKL's AVX-512 vmsSqrt (high accuracy) returns, bit for bit, computed inline: an
// estimate r ~ 1/sqrt(x) (vrsqrt14ps), s = x*r, then one correction s + (x - s*s) * r/2 with
// fused multiply-adds; below 2^-78 the residual is computed scaled by 2^78 so it does not
// underflow. +-0, +-inf and negative finite x are returned as they are (MKL turns a negative
// one into NaN afterwards: cpu.py only uses this when v cannot be negative). Within one ulp
// of the correctly rounded root, and not always equal to it: that is why torch.sqrt on x86
// Linux differs from IEEE sqrt. cpu.py checks on each machine that this matches torch.sqrt
// before using it (mkl_sqrt_inline()); calling MKL per tile instead costs far more with 2
// threads (its mode switch and call overhead per 2048 elements).
inline __m512 mkl_sqrt16_avx512(__m512 x) {
  const __m512 r = _mm512_rsqrt14_ps(x);
  const __mmask16 as_is = _mm512_fpclass_ps_mask(x, 0x5e);  // +-0, +-inf, negative finite
  const __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_set1_ps(0x1p39f), r, _CMP_LT_OS);  // x < 2^-78
  const __m512 h = _mm512_mul_ps(r, _mm512_set1_ps(0.5f));
  const __m512 s = _mm512_mul_ps(x, r);
  const __m512 xs = _mm512_mask_mul_ps(x, tiny, x, _mm512_set1_ps(0x1p78f));
  const __m512 ss = _mm512_mask_mul_ps(s, tiny, s, _mm512_set1_ps(0x1p39f));
  const __m512 hs = _mm512_mask_mul_ps(h, tiny, h, _mm512_set1_ps(0x1p-78f));
  const __m512 e = _mm512_fnmadd_ps(ss, ss, xs);  // x - s*s (scaled), exact
  return _mm512_mask_mov_ps(_mm512_fmadd_ps(e, hs, s), as_is, x);
}

// What MKL's generic SSE vmsSqrt (high accuracy) returns, bit for bit: the 12-bit estimate
// r ~ 1/sqrt(x) of rsqrtps (the SSE/AVX instruction, whose table differs from vrsqrt14ps's),
// then two coupled Newton steps for s ~ sqrt(x) and h ~ 1/(2 sqrt(x)), every operation rounded
// on its own (no fused multiply-add):
//     s = x*r, h = r*0.5, e = 0.5 - s*h, s' = s*e + s, h' = e*h + h,  sqrt = (x - s'*s')*h' + s'
// Zero, denormal, negative, infinite, NaN and the largest x (above 0x7f7ff000) go to MKL's
// scalar code, which returns +-0 as it is, NaN (0x7fc00000) for a negative x, x + x for +inf
// and NaN, and otherwise a double-precision root rounded to float: here the IEEE root, which
// cpu.py's check compares on every denormal and every x above 0x7f7ff000.
inline __m512 mkl_sqrt16_sse(__m512 x) {
  const __m256 r_lo = _mm256_rsqrt_ps(_mm512_castps512_ps256(x));
  const __m256 r_hi = _mm256_rsqrt_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  const __m512 r = _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(r_lo)), _mm256_castps_pd(r_hi), 1));
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 s = _mm512_mul_ps(x, r);
  const __m512 h = _mm512_mul_ps(r, half);
  const __m512 e = _mm512_sub_ps(half, _mm512_mul_ps(s, h));
  const __m512 s1 = _mm512_add_ps(_mm512_mul_ps(s, e), s);
  const __m512 h1 = _mm512_add_ps(_mm512_mul_ps(e, h), h);
  __m512 root = _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(x, _mm512_mul_ps(s1, s1)), h1), s1);
  // MKL's test for its scalar path: bits(x) + 0x7f800000 > 0xfefff000 as signed integers
  const __mmask16 rare = _mm512_cmpgt_epi32_mask(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(0x7f800000)),
                                                 _mm512_set1_epi32(static_cast<int>(0xfefff000u)));
  if (rare != 0) {
    root = _mm512_mask_sqrt_ps(root, rare, x);  // +-0, +inf and NaN as they are, IEEE root otherwise
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);  // not -0, not NaN
    root = _mm512_mask_mov_ps(root, negative, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000)));
  }
  return root;
}

template <int R>
inline __m512 mkl_sqrt16(__m512 x) {
  static_assert(R == kRootAvx512 || R == kRootSse, "an inline root");
  return R == kRootSse ? mkl_sqrt16_sse(x) : mkl_sqrt16_avx512(x);
}
#endif

#if ADAM8_AVX2
// mkl_sqrt16_sse on 8 lanes, the same operations: for CPUs with AVX2 and no AVX-512 (AMD's Zen 2
// and Zen 3, for instance), whose tiled loops take the root of a whole tile at once. (Written out
// at both widths like every loop here: mkl_sqrt16_sse as two calls of this one made the exact
// step 15-20 % slower on Zen 4.)
inline __m256 mkl_sqrt8_sse(__m256 x) {
  const __m256 r = _mm256_rsqrt_ps(x);
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 s = _mm256_mul_ps(x, r);
  const __m256 h = _mm256_mul_ps(r, half);
  const __m256 e = _mm256_sub_ps(half, _mm256_mul_ps(s, h));
  const __m256 s1 = _mm256_add_ps(_mm256_mul_ps(s, e), s);
  const __m256 h1 = _mm256_add_ps(_mm256_mul_ps(e, h), h);
  __m256 root = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(x, _mm256_mul_ps(s1, s1)), h1), s1);
  const __m256i rare = _mm256_cmpgt_epi32(_mm256_add_epi32(_mm256_castps_si256(x), _mm256_set1_epi32(0x7f800000)),
                                          _mm256_set1_epi32(static_cast<int>(0xfefff000u)));
  if (!_mm256_testz_si256(rare, rare)) {
    root = _mm256_blendv_ps(root, _mm256_sqrt_ps(x), _mm256_castsi256_ps(rare));
    const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    root = _mm256_blendv_ps(root, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)), negative);
  }
  return root;
}

// n roots with mkl_sqrt8_sse (the last partial vector through a zero-padded copy)
inline void mkl_sqrt8_sse_roots(const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, mkl_sqrt8_sse(_mm256_loadu_ps(in + i)));
  if (i < n) {
    alignas(32) float tail[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(tail, in + i, static_cast<size_t>(n - i) * sizeof(float));
    _mm256_store_ps(tail, mkl_sqrt8_sse(_mm256_load_ps(tail)));
    std::memcpy(out + i, tail, static_cast<size_t>(n - i) * sizeof(float));
  }
}
#endif

// sqrt of n floats as torch.sqrt computes it here: IEEE sqrt, or MKL's vmsSqrt (called, or
// computed inline by mkl_sqrt16 when cpu.py found that to match and denormals are not flushed)
struct Sqrt {
  using VmsSqrt = void (*)(int n, const float* in, float* out, int64_t mode);
  VmsSqrt mkl;       // nullptr: IEEE sqrt
  int64_t mode;      // the VML mode torch passes (VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE)
  int root;          // Root: kRootCall calls mkl; else computes MKL's result inline that way
  template <int R>
  static void inline_roots(const float* in, float* out, int64_t n) {
#if ADAM8_AVX512
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1);
      _mm512_mask_storeu_ps(out + i, k, mkl_sqrt16<R>(_mm512_maskz_loadu_ps(k, in + i)));
    }
#else
    (void)in, (void)out, (void)n;
#endif
  }
  void operator()(const float* in, float* out, int64_t n) const {
    if (root == kRootAvx512) return inline_roots<kRootAvx512>(in, out, n);
    if (root == kRootSse) {
#if ADAM8_AVX512
      return inline_roots<kRootSse>(in, out, n);
#elif ADAM8_AVX2
      return mkl_sqrt8_sse_roots(in, out, n);
#endif
    }
    if (mkl != nullptr) {
      mkl(static_cast<int>(n), in, out, mode);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(in[i]);
  }
};

// The non-finite rule: an element whose new m or new v is not finite (a NaN/Inf gradient, or
// a finite one so large that g*g overflows) restarts from m = v = 0 and keeps its parameter.
// Between the two passes the tile buffer marks such an element by storing its v as -0.0:
// a real new v is never -0.0 (it is b2*v + ((1-b2)*g)*g with v >= 0, a sum of +0 or positive
// terms), and -0.0 requantizes exactly like +0.0 (the code tables sample nearest_code(-0.0)).
constexpr uint32_t kResetV = 0x80000000u;
inline bool is_reset(float v) { return bits_of(v) == kResetV; }

#if ADAM8_AVX2
// ---- 8 elements at a time (AVX2) ---------------------------------------------------------
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const _Float16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 load8(const BF16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(_Float16* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store8(BF16* p, __m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
// all-ones where x is NaN or +-Inf
inline __m256i non_finite8(__m256 x) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exp_mask), exp_mask);
}
inline __m256 reset8(__m256 v) {  // all-ones where v carries the reset mark
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_castps_si256(v), _mm256_set1_epi32(static_cast<int>(kResetV))));
}
inline __m256i load_codes8(const uint8_t* s) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
}
inline void store_codes8(uint8_t* s, __m256i codes) {  // 8 int32 in 0..255 -> 8 bytes
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(s), _mm_packus_epi16(words, words));
}

inline float max8(__m256 x) {  // largest of 8 (no NaN among them)
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
  return _mm_cvtss_f32(y);
}
#endif

#if ADAM8_AVX512
// ---- 16 elements at a time (AVX-512) -----------------------------------------------------
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const _Float16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const BF16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(_Float16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store16(BF16* p, __m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline __mmask16 reset16(__m512 v) {
  return _mm512_cmpeq_epi32_mask(_mm512_castps_si512(v), _mm512_set1_epi32(static_cast<int>(kResetV)));
}
inline __m512i load_codes16(const uint8_t* s) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}
inline void store_codes16(uint8_t* s, __m512i codes) {  // the low byte of 16 int32 -> 16 bytes
  _mm_storeu_si128(reinterpret_cast<__m128i*>(s), _mm512_cvtepi32_epi8(codes));  // (vpmovdb truncates)
}

#endif

}  // namespace
