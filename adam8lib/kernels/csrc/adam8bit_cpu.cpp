// The 8-bit Adam step on the CPU: OpenMP threads over runs of blocks, AVX2/AVX-512 inside a block.
// (It is also the FP8 format's step, given FP8's code values and tables; the 4-bit formats' step
// is at the end of this file, built on the same pieces.)
//
// Plain C++ (no torch headers, so it builds in seconds). adam8lib/kernels/cpu.py builds it
// with -O3 -march=native -fopenmp -ffp-contract=off, checks every argument, and calls
// adam8bit_step_cpu (bottom of this file) through ctypes with the tensors' data pointers.
//
// Exact mode computes exactly what adam8lib/kernels/reference.py computes, with the same fp32
// operations in the same order, so codes, absmax and parameters are bit-identical. Work goes
// by tiles (whole blocks, ~2048 elements; one block if blocks are larger) and makes two
// passes over per-thread buffers that stay in cache:
//   1. each block:  m = qmap1[state1] * absmax1        v = qmap2[state2] * absmax2   (dequantize)
//                   m = m * beta1 + (1 - beta1) * g     v = v * beta2 + (1 - beta2) * g * g
//                   m or v not finite: m = v = 0 (and the element is marked: see kResetV)
//                   new absmax1 = max |m|, new absmax2 = max v
//   2. sqrt(v) for the whole tile, then each block:
//                   p = p * (1 - lr*wd) + (-step_size * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//                   (a reset element keeps its p)
//                   state1 = nearest code of m * (1/absmax1), state2 = that of v * (1/absmax2)
//                   (keeping signs: a non-zero value never gets the code of 0 or of the other sign)
// With AVX-512 VBMI, when no sqrt call is needed (fast mode, or MKL's sqrt computed inline),
// the passes go block by block instead, software-pipelined: pass 2 of one block runs in the
// same loop as pass 1 of the next (step_pipelined), with the same operations per element.
// Fast mode (exact = 0) differs only in step 2's parameter update: IEEE sqrt inline and
// denom = fma(sqrt(v), 1/sqrt(1 - beta2^t), eps) (parameters within ~1 ulp of the update).
//
// Each loop is written three times: scalar (the spec, readable; also a block's last elements
// and CPUs without AVX2), AVX2 (8 elements at a time) and AVX-512 (16), with the same
// operations in the same order. The tests run all of them.
//
// Rounding that matters for bit-identity (cpu.py asks this torch build and passes flags):
// * torch computes m.add_(g, alpha=a) as fma(g, a, m) and v.addcmul_(g, g, value=b) as
//   fma(b*g, g, v) on AVX2/AVX-512 builds (`fused`). Every other operation is rounded
//   separately, hence -ffp-contract=off: the compiler must not fuse a*b+c by itself.
// * torch.sqrt on x86 Linux wheels is Intel MKL's vmsSqrt (within 1 ulp, but about 1 in 6
//   results is not the correctly rounded one); then this kernel computes the same thing inline
//   (MKL's algorithm for this CPU: Root, mkl_sqrt16) or calls the same function.
//
// Dequantizing without gathers (AVX-512 VBMI): see BytePlanes below.
//
// Nearest code without searching the 256-entry map: the reference's nearest_code(x) is a
// step function of x. adam8lib/kernels/code_table.py samples it exactly into a table indexed
// by the top 16 bits of x's bits (a "bucket": 65,536 floats in a row; CodeTable.raw_steps).
// Each entry packs the code below a threshold inside the bucket (bits 0-7), the code from it
// on (bits 8-15) and the threshold minus one (bits 16-31), so that
//     code(x) = (bits(x) << 16) > entry ? bits 8-15 : bits 0-7      (unsigned compare)
// one shift, one table load and one compare, for either sign (the table stores negative
// buckets with their order reversed); NaN buckets hold the reference's code for NaN.
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

// ---- one quantization map with its nearest-code tables (built by cpu.py) ----------------
struct CodeTable {
  const float* qmap;     // 256 code values (a map, or FP8 bytes / 448: any order, NaN allowed)
  const int32_t* steps;  // 65536 buckets by raw bits: below | from threshold on << 8 | (threshold - 1) << 16
  int32_t nan_code;      // the reference's code for NaN
};

inline uint8_t nearest_code(float x, const CodeTable& t) {
  const uint32_t bits = bits_of(x);
  const uint32_t entry = static_cast<uint32_t>(t.steps[bits >> 16]);
  return static_cast<uint8_t>((bits << 16) > entry ? entry >> 8 : entry);  // NaN: in the table
}

// fp32 hyperparameters, rounded from Python's floats by cpu.py (as torch rounds its scalars)
struct Hyper {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;          // 1 - lr * weight_decay (exactly 1 without weight decay: p * 1 == p)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float inv_bc2_sqrt;   // 1 / sqrt(1 - beta2^t), used by the fast mode only
};

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

// ---- the three per-element steps, scalar ----------------------------------------------------
// 1. dequantize, update the moments (Fused: as torch's fused multiply-adds), apply the rule
template <bool Fused>
inline void update_moments(float grad, uint8_t c1, uint8_t c2, float old_absmax1, float old_absmax2,
                           const CodeTable& t1, const CodeTable& t2, const Hyper& h, float& m_out, float& v_out) {
  float m = t1.qmap[c1] * old_absmax1;
  float v = t2.qmap[c2] * old_absmax2;
  m = m * h.beta1;
  v = v * h.beta2;
  if (Fused) {
    m = std::fma(grad, h.one_minus_beta1, m);
    v = std::fma(h.one_minus_beta2 * grad, grad, v);
  } else {
    m = m + h.one_minus_beta1 * grad;
    v = v + (h.one_minus_beta2 * grad) * grad;
  }
  const bool finite = is_finite(m) && is_finite(v);
  m_out = finite ? m : 0.0f;
  v_out = finite ? v : float_of(kResetV);
}

// 2. the parameter update; Exact: torch's operations (sqrt_v from torch's sqrt), else the
// fast mode's: IEEE sqrt here, and a multiply by 1/sqrt(1 - beta2^t) instead of a division
template <bool Exact>
inline float update_param(float param, float m, float v, float sqrt_v, const Hyper& h) {
  float denom;
  if (Exact) {
    denom = sqrt_v / h.bc2_sqrt + h.eps;
  } else {
    denom = std::fma(std::sqrt(v), h.inv_bc2_sqrt, h.eps);
  }
  const float updated = param * h.decay + (h.neg_step_size * m) / denom;
  return is_reset(v) ? param : updated;
}

#if ADAM8_AVX2
// ---- the same steps, 8 elements at a time (AVX2) -----------------------------------------
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

template <bool Fused>
inline void update_moments8(__m256 grad, __m256 q1, __m256 q2, __m256 old_absmax1, __m256 old_absmax2,
                            const Hyper& h, __m256& m_out, __m256& v_out) {
  __m256 m = _mm256_mul_ps(q1, old_absmax1);
  __m256 v = _mm256_mul_ps(q2, old_absmax2);
  m = _mm256_mul_ps(m, _mm256_set1_ps(h.beta1));
  v = _mm256_mul_ps(v, _mm256_set1_ps(h.beta2));
  const __m256 b_grad = _mm256_mul_ps(_mm256_set1_ps(h.one_minus_beta2), grad);
  if (Fused) {
    m = _mm256_fmadd_ps(grad, _mm256_set1_ps(h.one_minus_beta1), m);
    v = _mm256_fmadd_ps(b_grad, grad, v);
  } else {
    m = _mm256_add_ps(m, _mm256_mul_ps(_mm256_set1_ps(h.one_minus_beta1), grad));
    v = _mm256_add_ps(v, _mm256_mul_ps(b_grad, grad));
  }
  const __m256 bad = _mm256_castsi256_ps(_mm256_or_si256(non_finite8(m), non_finite8(v)));
  m_out = _mm256_andnot_ps(bad, m);
  v_out = _mm256_blendv_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kResetV))), bad);
}

template <bool Exact>
inline __m256 update_param8(__m256 param, __m256 m, __m256 v, __m256 sqrt_v, const Hyper& h) {
  __m256 denom;
  if (Exact) {
    denom = _mm256_add_ps(_mm256_div_ps(sqrt_v, _mm256_set1_ps(h.bc2_sqrt)), _mm256_set1_ps(h.eps));
  } else {
    denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), _mm256_set1_ps(h.inv_bc2_sqrt), _mm256_set1_ps(h.eps));
  }
  const __m256 step = _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(h.neg_step_size), m), denom);
  const __m256 updated = _mm256_add_ps(_mm256_mul_ps(param, _mm256_set1_ps(h.decay)), step);
  return _mm256_blendv_ps(updated, param, reset8(v));
}

inline __m256i nearest_code8(__m256 x, const CodeTable& t) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i entry = _mm256_i32gather_epi32(t.steps, _mm256_srli_epi32(bits, 16), 4);
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);  // AVX2 compares signed: flip both signs
  const __m256i above = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_slli_epi32(bits, 16), flip),
                                           _mm256_xor_si256(entry, flip));
  // bits 0-7, or bits 8-15 where (bits << 16) > entry
  return _mm256_and_si256(_mm256_srlv_epi32(entry, _mm256_and_si256(above, _mm256_set1_epi32(8))),
                          _mm256_set1_epi32(0xff));
}

inline float max8(__m256 x) {  // largest of 8 (no NaN among them)
  __m128 y = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  y = _mm_max_ps(y, _mm_movehl_ps(y, y));
  y = _mm_max_ss(y, _mm_shuffle_ps(y, y, 1));
  return _mm_cvtss_f32(y);
}
#endif

#if ADAM8_AVX512
// ---- the same steps, 16 elements at a time (AVX-512) ------------------------------------
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

// the moments without the non-finite rule (the AVX-512 loops apply it per block: moments_block)
template <bool Fused>
inline void moments16(__m512 grad, __m512 q1, __m512 q2, __m512 old_absmax1, __m512 old_absmax2, const Hyper& h,
                      __m512& m_out, __m512& v_out) {
  __m512 m = _mm512_mul_ps(q1, old_absmax1);
  __m512 v = _mm512_mul_ps(q2, old_absmax2);
  m = _mm512_mul_ps(m, _mm512_set1_ps(h.beta1));
  v = _mm512_mul_ps(v, _mm512_set1_ps(h.beta2));
  const __m512 b_grad = _mm512_mul_ps(_mm512_set1_ps(h.one_minus_beta2), grad);
  if (Fused) {
    m = _mm512_fmadd_ps(grad, _mm512_set1_ps(h.one_minus_beta1), m);
    v = _mm512_fmadd_ps(b_grad, grad, v);
  } else {
    m = _mm512_add_ps(m, _mm512_mul_ps(_mm512_set1_ps(h.one_minus_beta1), grad));
    v = _mm512_add_ps(v, _mm512_mul_ps(b_grad, grad));
  }
  m_out = m;
  v_out = v;
}

template <bool Exact, bool MayReset>
inline __m512 update_param16(__m512 param, __m512 m, __m512 v, __m512 sqrt_v, const Hyper& h) {
  __m512 denom;
  if (Exact) {
    denom = _mm512_add_ps(_mm512_div_ps(sqrt_v, _mm512_set1_ps(h.bc2_sqrt)), _mm512_set1_ps(h.eps));
  } else {
    denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), _mm512_set1_ps(h.inv_bc2_sqrt), _mm512_set1_ps(h.eps));
  }
  const __m512 step = _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(h.neg_step_size), m), denom);
  const __m512 updated = _mm512_add_ps(_mm512_mul_ps(param, _mm512_set1_ps(h.decay)), step);
  return MayReset ? _mm512_mask_blend_ps(reset16(v), updated, param) : updated;
}

// codes as int32 whose low byte is the code (the byte stores keep only that byte)
// (ADAM8_KNOCKOUT_GATHER: a timing-only build for bench/profile_step.py, whose "codes" are
// wrong on purpose: the table gather replaced by one register permute, to measure its cost)
inline __m512i nearest_code16(__m512 x, const CodeTable& t) {
  const __m512i bits = _mm512_castps_si512(x);
#if defined(ADAM8_KNOCKOUT_GATHER)
  (void)t;
  const __m512i entry = _mm512_permutexvar_epi32(_mm512_srli_epi32(bits, 16), bits);
#else
  const __m512i entry = _mm512_i32gather_epi32(_mm512_srli_epi32(bits, 16), t.steps, 4);
#endif
  const __mmask16 above = _mm512_cmpgt_epu32_mask(_mm512_slli_epi32(bits, 16), entry);
  return _mm512_mask_srli_epi32(entry, above, entry, 8);  // bits 0-7, or bits 8-15
}

// Dequantizing without a gather: a map's 256 fp32 values as four "byte planes" (byte k of
// every value, 256 bytes = four 64-byte registers each). With AVX-512 VBMI one vpermi2b looks
// up 64 codes at once in 128 bytes of a plane (7 index bits), a second one in the other 128,
// and bit 7 of the code picks between them; four planes give the four bytes of each value,
// and two rounds of byte/word interleaves assemble 64 floats. Those interleaves work inside
// 128-bit lanes, so the 64 codes are first put in the order that makes the floats come out in
// memory order (kInterleave).
struct BytePlanes {
  alignas(64) uint8_t plane[4][256];
  explicit BytePlanes(const float* qmap) {
    for (int c = 0; c < 256; ++c) {
      const uint32_t u = bits_of(qmap[c]);
      for (int k = 0; k < 4; ++k) plane[k][c] = static_cast<uint8_t>(u >> (8 * k));
    }
  }
};

#if defined(__AVX512VBMI__)
constexpr bool kBytePlanes = true;
// element j of the result vectors comes from code kInterleave[j] (a 4x4 transpose of 16-byte groups)
inline __m512i interleave_order() {
  alignas(64) uint8_t order[64];
  for (int lane = 0; lane < 4; ++lane)
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 4; ++i) order[16 * lane + 4 * k + i] = static_cast<uint8_t>(16 * k + 4 * lane + i);
  return _mm512_load_si512(order);
}

// 64 codes -> the 64 map values, as 4 vectors of 16 in memory order
inline void dequantize64(const BytePlanes& t, const uint8_t* codes, __m512i order, __m512 out[4]) {
  const __m512i idx = _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes));
  const __mmask64 upper = _mm512_movepi8_mask(idx);  // bit 7: codes 128..255
  __m512i b[4];
  for (int k = 0; k < 4; ++k) {
    const __m512i* p = reinterpret_cast<const __m512i*>(t.plane[k]);
    const __m512i lo = _mm512_permutex2var_epi8(_mm512_load_si512(p), idx, _mm512_load_si512(p + 1));
    const __m512i hi = _mm512_permutex2var_epi8(_mm512_load_si512(p + 2), idx, _mm512_load_si512(p + 3));
    b[k] = _mm512_mask_blend_epi8(upper, lo, hi);
  }
  const __m512i w01_lo = _mm512_unpacklo_epi8(b[0], b[1]), w01_hi = _mm512_unpackhi_epi8(b[0], b[1]);
  const __m512i w23_lo = _mm512_unpacklo_epi8(b[2], b[3]), w23_hi = _mm512_unpackhi_epi8(b[2], b[3]);
  out[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01_lo, w23_lo));
  out[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01_lo, w23_lo));
  out[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(w01_hi, w23_hi));
  out[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(w01_hi, w23_hi));
}
#else
constexpr bool kBytePlanes = false;
#endif
#endif

// ---- one tile: a run of whole blocks ---------------------------------------------------------
// Tables and hyperparameters are passed by value: stores through uint8_t* may alias anything,
// so fields read through a reference would be reloaded in every loop.
constexpr int64_t kTile = 2048;  // elements per tile when blocks are smaller (one sqrt call each)
constexpr int64_t kAhead = 2 * kTile;  // how far ahead pass 1 asks for g and the codes (elements)
// Threads take the work in runs of at most kRun elements (at least four runs per thread when
// the tensor has enough blocks), each as it becomes free (OpenMP's dynamic schedule), not in
// one equal share each: on a shared machine a thread that loses its
// core for a while would otherwise hold up the whole step (measured: 5-10 % at 16.8M, 2 threads).
constexpr int64_t kRun = int64_t{1} << 18;

struct Buffers {  // per-thread scratch for one tile; stays in cache
  alignas(64) float m[kMaxBlocksize];
  alignas(64) float v[kMaxBlocksize];
  alignas(64) float sqrt_v[kMaxBlocksize];
};

struct Maps {  // both maps, in every form the loops use
  CodeTable t1, t2;
#if ADAM8_AVX512
  const BytePlanes* planes1;
  const BytePlanes* planes2;
#endif
};

// Both maps for one call of an entry point: their tables, and with AVX-512 their byte planes (kept here
// for the call; Maps points at them).
struct CallMaps {
#if ADAM8_AVX512
  BytePlanes planes1, planes2;
#endif
  Maps maps;
  CallMaps(const float* qmap1, const int32_t* steps1, int nan_code1, const float* qmap2, const int32_t* steps2,
           int nan_code2)
      :
#if ADAM8_AVX512
        planes1(qmap1), planes2(qmap2),
#endif
        maps{CodeTable{qmap1, steps1, nan_code1}, CodeTable{qmap2, steps2, nan_code2}
#if ADAM8_AVX512
             , &planes1, &planes2
#endif
        } {
  }
  CallMaps(const CallMaps&) = delete;
  CallMaps& operator=(const CallMaps&) = delete;
};

#if ADAM8_AVX512
// Pass 1 for the 16 elements from k on, their map values q1, q2 given (without the non-finite
// rule): new m and v into m[k..] and v[k..], their maxima as bits (|m| and v) into vmax1, vmax2.
template <typename G, bool Fused>
inline void moments16_into(const G* __restrict g, int64_t k, __m512 q1, __m512 q2, __m512 vold1, __m512 vold2,
                           const Hyper& h, float* __restrict m, float* __restrict v, __m512i& vmax1, __m512i& vmax2) {
  __m512 mk, vk;
  moments16<Fused>(load16(g + k), q1, q2, vold1, vold2, h, mk, vk);
  _mm512_store_ps(m + k, mk);
  _mm512_store_ps(v + k, vk);
  vmax1 = _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(mk), _mm512_set1_epi32(0x7fffffff)), vmax1);
  vmax2 = _mm512_max_epu32(_mm512_castps_si512(vk), vmax2);
}
#endif

#if ADAM8_AVX512 && defined(__AVX512VBMI__)
// Pass 1 for the 64 elements from i on (AVX-512 VBMI, without the non-finite rule): new m and v
// into m[i..] and v[i..], their maxima as bits (|m| and v) into vmax1 and vmax2.
// It also asks the cache for the same elements of p (p_bytes each), which pass 2 reads next:
// pass 1 streams g and the codes, pass 2 streams p, and without the hint p would start cold.
// And it prefetches g and the codes kAhead elements on into L2: one core keeps more of its
// memory requests in flight than the hardware prefetcher alone gets it to (no fault past the
// end: a prefetch is a hint).
template <typename G, bool Fused>
inline void moments64(const G* __restrict g, const uint8_t* __restrict s1, const uint8_t* __restrict s2, int64_t i,
                      const Maps& maps, const Hyper& h, __m512 vold1, __m512 vold2, __m512i order,
                      float* __restrict m, float* __restrict v, __m512i& vmax1, __m512i& vmax2, const char* p,
                      int64_t p_bytes) {
  for (int64_t b = 0; b < 64 * p_bytes; b += 64) _mm_prefetch(p + i * p_bytes + b, _MM_HINT_T0);
  for (int64_t b = 0; b < 64 * static_cast<int64_t>(sizeof(G)); b += 64)
    _mm_prefetch(reinterpret_cast<const char*>(g + i + kAhead) + b, _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(s1 + i + kAhead), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(s2 + i + kAhead), _MM_HINT_T1);
  __m512 q1[4], q2[4];
  dequantize64(*maps.planes1, s1 + i, order, q1);
  dequantize64(*maps.planes2, s2 + i, order, q2);
  for (int j = 0; j < 4; ++j) moments16_into<G, Fused>(g, i + 16 * j, q1[j], q2[j], vold1, vold2, h, m, v, vmax1, vmax2);
}
#endif

// Pass 1 for the block [lo, hi): new m and v into buf (the non-finite rule applied);
// absmax1/absmax2 come in as the old scales and go out as the new ones (max |m|, max v:
// always finite, since the rule leaves no non-finite m or v). Returns whether an element of
// the block was reset (pass 2 then checks every element for the mark).
// The AVX-512 loops skip the rule: they take the maxima as unsigned integers over the bits of
// |m| and of v, where every NaN and infinity is >= 0x7f800000 (and so is a v with its sign bit
// set, which only a map with negative entries for v could make). A block whose maxima reach
// that is rare; it is redone from its start by the loops below, which apply the rule.
// The 64-element loop also prefetches (moments64: p for pass 2, g and the codes further on).
template <typename G, bool Fused>
bool moments_block(const G* __restrict g, const uint8_t* __restrict s1, const uint8_t* __restrict s2, int64_t lo,
                   int64_t hi, const Maps& maps, const Hyper h, Buffers& buf, int simd, float& absmax1,
                   float& absmax2, const char* p, int64_t p_bytes) {
  const float old1 = absmax1, old2 = absmax2;
  float max1 = 0.0f, max2 = 0.0f;
  bool reset = false;
  int64_t i = lo;
#if ADAM8_AVX512
  if (simd == kAvx512) {
    const __m512 vold1 = _mm512_set1_ps(old1), vold2 = _mm512_set1_ps(old2);
    __m512i vmax1 = _mm512_setzero_si512(), vmax2 = _mm512_setzero_si512();
#if defined(__AVX512VBMI__)
    const __m512i order = interleave_order();
    for (; i + 64 <= hi; i += 64) {
      moments64<G, Fused>(g, s1, s2, i, maps, h, vold1, vold2, order, buf.m, buf.v, vmax1, vmax2, p, p_bytes);
    }
#endif
    for (; i + 16 <= hi; i += 16) {
      moments16_into<G, Fused>(g, i, _mm512_i32gather_ps(load_codes16(s1 + i), maps.t1.qmap, 4),
                               _mm512_i32gather_ps(load_codes16(s2 + i), maps.t2.qmap, 4), vold1, vold2, h, buf.m,
                               buf.v, vmax1, vmax2);
    }
    const uint32_t bits1 = _mm512_reduce_max_epu32(vmax1), bits2 = _mm512_reduce_max_epu32(vmax2);
    if (bits1 >= 0x7f800000u || bits2 >= 0x7f800000u) {
      i = lo;  // a non-finite (or negative) value in the block: redo it with the rule
    } else {
      max1 = float_of(bits1);
      max2 = float_of(bits2);
    }
  }
#endif
#if ADAM8_AVX2
  if (simd != kScalar) {
    const __m256 vold1 = _mm256_set1_ps(old1), vold2 = _mm256_set1_ps(old2);
    __m256 vmax1 = _mm256_set1_ps(max1), vmax2 = _mm256_set1_ps(max2);
    __m256 any_reset = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; i + 8 <= hi; i += 8) {
      __m256 m, v;
      const __m256 q1 = _mm256_i32gather_ps(maps.t1.qmap, load_codes8(s1 + i), 4);
      const __m256 q2 = _mm256_i32gather_ps(maps.t2.qmap, load_codes8(s2 + i), 4);
      update_moments8<Fused>(load8(g + i), q1, q2, vold1, vold2, h, m, v);
      _mm256_store_ps(buf.m + i, m);
      _mm256_store_ps(buf.v + i, v);
      vmax1 = _mm256_max_ps(_mm256_and_ps(m, abs_mask), vmax1);
      vmax2 = _mm256_max_ps(_mm256_and_ps(v, abs_mask), vmax2);
      any_reset = _mm256_or_ps(any_reset, reset8(v));
    }
    max1 = max8(vmax1);
    max2 = max8(vmax2);
    reset = _mm256_movemask_ps(any_reset) != 0;
  }
#endif
  for (; i < hi; ++i) {
    update_moments<Fused>(to_float(g[i]), s1[i], s2[i], old1, old2, maps.t1, maps.t2, h, buf.m[i], buf.v[i]);
    max1 = std::max(max1, std::fabs(buf.m[i]));
    max2 = std::max(max2, std::fabs(buf.v[i]));
    reset = reset || is_reset(buf.v[i]);
  }
  absmax1 = max1;
  absmax2 = max2;
  return reset;
}

#if ADAM8_AVX512
// 64 codes (the low bytes of four vectors of 16 int32) stored as 64 bytes
inline void store_codes64(uint8_t* s, const __m512i codes[4]) {
#if defined(__AVX512VBMI__)
  // byte 4j of two vectors side by side (128 bytes) for j < 32: their 32 codes in order
  const __m512i low_bytes = _mm512_set_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 124, 120, 116, 112, 108, 104, 100, 96, 92, 88, 84, 80,
                                            76, 72, 68, 64, 60, 56, 52, 48, 44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
  const __m512i c01 = _mm512_permutex2var_epi8(codes[0], low_bytes, codes[1]);
  const __m512i c23 = _mm512_permutex2var_epi8(codes[2], low_bytes, codes[3]);
  _mm512_storeu_si512(s, _mm512_inserti64x4(c01, _mm512_castsi512_si256(c23), 1));
#else
  for (int j = 0; j < 4; ++j) store_codes16(s + 16 * j, codes[j]);
#endif
}

// Pass 2 for the 16 elements from k on (AVX-512): update p, and their new codes (as int32)
// into c1, c2. The exact mode's sqrt(v): from sqrt_v (Root kRootCall), or mkl_sqrt16<Root> here.
template <typename P, bool Exact, bool MayReset, int Root>
inline void param_and_codes16(P* __restrict p, int64_t k, const float* __restrict m_buf,
                              const float* __restrict v_buf, const float* __restrict sqrt_v_buf, __m512 vinv1,
                              __m512 vinv2, const Maps& maps, const Hyper& h, __m512i& c1, __m512i& c2) {
  const __m512 m = _mm512_load_ps(m_buf + k), v = _mm512_load_ps(v_buf + k);
  __m512 sqrt_v = v;  // (the fast mode takes its own root of v)
  if constexpr (Exact && Root != kRootCall) {
    sqrt_v = mkl_sqrt16<Root>(v);
  } else if constexpr (Exact) {
    sqrt_v = _mm512_load_ps(sqrt_v_buf + k);
  }
  store16(p + k, update_param16<Exact, MayReset>(load16(p + k), m, v, sqrt_v, h));
  c1 = nearest_code16(_mm512_mul_ps(m, vinv1), maps.t1);
  c2 = nearest_code16(_mm512_mul_ps(v, vinv2), maps.t2);
}

// the same for the 64 elements from i on, their codes stored
template <typename P, bool Exact, bool MayReset, int Root>
inline void param_and_codes64(P* __restrict p, uint8_t* __restrict s1, uint8_t* __restrict s2, int64_t i,
                              const float* __restrict m_buf, const float* __restrict v_buf,
                              const float* __restrict sqrt_v_buf, __m512 vinv1, __m512 vinv2, const Maps& maps,
                              const Hyper& h) {
  __m512i c1[4], c2[4];
  for (int j = 0; j < 4; ++j) {
    param_and_codes16<P, Exact, MayReset, Root>(p, i + 16 * j, m_buf, v_buf, sqrt_v_buf, vinv1, vinv2, maps,
                                                      h, c1[j], c2[j]);
  }
  store_codes64(s1 + i, c1);
  store_codes64(s2 + i, c2);
}
#endif

// Pass 2 for the block [lo, hi): update p, and requantize m and v with the new scales
// (multiplying by 1/absmax, as the reference does). MayReset: pass 1 reset an element of the
// block, so each element's v is checked for the mark (else no element carries it).
template <typename P, bool Exact, bool MayReset>
void param_and_codes_block(P* __restrict p, uint8_t* __restrict s1, uint8_t* __restrict s2, int64_t lo, int64_t hi,
                           float absmax1, float absmax2, const Maps& maps, const Hyper h, const Buffers& buf,
                           int simd) {
  const float inv1 = absmax1 > 0.0f ? 1.0f / absmax1 : 0.0f;
  const float inv2 = absmax2 > 0.0f ? 1.0f / absmax2 : 0.0f;
  int64_t i = lo;
  // with finite inverses m * inv1 and v * inv2 are never NaN (a denormal absmax can make
  // 1/absmax infinite, and 0 * inf is NaN: those rare blocks take the scalar loop)
  const bool vector = simd != kScalar && is_finite(inv1) && is_finite(inv2);
#if ADAM8_AVX512
  if (vector && simd == kAvx512) {
    const __m512 vinv1 = _mm512_set1_ps(inv1), vinv2 = _mm512_set1_ps(inv2);
    for (; i + 64 <= hi; i += 64) {
      param_and_codes64<P, Exact, MayReset, kRootCall>(p, s1, s2, i, buf.m, buf.v, buf.sqrt_v, vinv1, vinv2, maps, h);
    }
    for (; i + 16 <= hi; i += 16) {
      __m512i c1, c2;
      param_and_codes16<P, Exact, MayReset, kRootCall>(p, i, buf.m, buf.v, buf.sqrt_v, vinv1, vinv2, maps, h, c1, c2);
      store_codes16(s1 + i, c1);
      store_codes16(s2 + i, c2);
    }
  }
#endif
#if ADAM8_AVX2
  if (vector) {
    const __m256 vinv1 = _mm256_set1_ps(inv1), vinv2 = _mm256_set1_ps(inv2);
    for (; i + 8 <= hi; i += 8) {
      const __m256 m = _mm256_load_ps(buf.m + i), v = _mm256_load_ps(buf.v + i);
      const __m256 sqrt_v = Exact ? _mm256_load_ps(buf.sqrt_v + i) : v;
      store8(p + i, update_param8<Exact>(load8(p + i), m, v, sqrt_v, h));
      store_codes8(s1 + i, nearest_code8(_mm256_mul_ps(m, vinv1), maps.t1));
      store_codes8(s2 + i, nearest_code8(_mm256_mul_ps(v, vinv2), maps.t2));
    }
  }
#endif
  for (; i < hi; ++i) {
    const float sqrt_v = Exact ? buf.sqrt_v[i] : 0.0f;
    p[i] = from_float<P>(update_param<Exact>(to_float(p[i]), buf.m[i], buf.v[i], sqrt_v, h));
    s1[i] = nearest_code(buf.m[i] * inv1, maps.t1);
    s2[i] = nearest_code(buf.v[i] * inv2, maps.t2);
  }
}

// the same, MayReset chosen at run time (whether pass 1 reset an element of the block)
template <typename P, bool Exact>
void param_and_codes_block(bool may_reset, P* __restrict p, uint8_t* __restrict s1, uint8_t* __restrict s2,
                           int64_t lo, int64_t hi, float absmax1, float absmax2, const Maps& maps, const Hyper& h,
                           const Buffers& buf, int simd) {
  if (may_reset) {
    param_and_codes_block<P, Exact, true>(p, s1, s2, lo, hi, absmax1, absmax2, maps, h, buf, simd);
  } else {
    param_and_codes_block<P, Exact, false>(p, s1, s2, lo, hi, absmax1, absmax2, maps, h, buf, simd);
  }
}

template <typename P, typename G, bool Fused, bool Exact>
void step_tile(P* __restrict p, const G* __restrict g, uint8_t* __restrict s1, uint8_t* __restrict s2,
               float* absmax1, float* absmax2, int64_t n, int64_t blocksize, const Maps& maps, const Hyper& h,
               const Sqrt& sqrt_of, Buffers& buf, int simd) {
  // 1. dequantize and update m and v, block by block (each block has its own scales)
  bool reset[kTile];  // per block: was an element reset? (blocks per tile <= kTile)
  for (int64_t lo = 0, b = 0; lo < n; lo += blocksize, ++b) {
    reset[b] = moments_block<G, Fused>(g, s1, s2, lo, std::min(n, lo + blocksize), maps, h, buf, simd, absmax1[b],
                                       absmax2[b], reinterpret_cast<const char*>(p), sizeof(P));
  }
  // 2. sqrt(v) for the whole tile (exact mode: torch's sqrt), then update p and requantize
  if (Exact) sqrt_of(buf.v, buf.sqrt_v, n);
  for (int64_t lo = 0, b = 0; lo < n; lo += blocksize, ++b) {
    param_and_codes_block<P, Exact>(reset[b], p, s1, s2, lo, std::min(n, lo + blocksize), absmax1[b], absmax2[b],
                                    maps, h, buf, simd);
  }
}

#if ADAM8_AVX512 && defined(__AVX512VBMI__)
// The common case on CPUs with AVX-512 VBMI, when no square-root call is needed (the fast mode,
// or MKL's sqrt computed inline): the whole blocks [b0, b1) of one run (kRun), software-pipelined.
// One loop runs pass 2 of block b and pass 1 of block b + 1, 64 elements of each in turn: pass
// 1 is mostly byte shuffles, pass 2 mostly gathers, divisions and square roots, so together they
// keep more of the core's execution units busy than either alone, and block b's new scales are
// ready before its pass 2 starts. The blocks alternate between the two buffers. A block whose
// pass 1 met a non-finite value is redone with the rule (moments_block) and finished by the
// general loops, as are blocks whose inverse scales are not finite.
template <typename P, typename G, bool Fused, bool Exact, int Root>
void step_pipelined(P* p, const G* g, uint8_t* s1, uint8_t* s2, float* absmax1, float* absmax2, int64_t b0,
                    int64_t b1, int64_t blocksize, const Maps& maps, const Hyper h, const Sqrt& sqrt_of,
                    Buffers buf[2]) {
  if (b0 >= b1) return;
  const __m512i order = interleave_order();
  const auto p_at = [&](int64_t base) { return reinterpret_cast<const char*>(p + base); };
  __m512 vold1 = _mm512_set1_ps(absmax1[b0]), vold2 = _mm512_set1_ps(absmax2[b0]);
  __m512i vmax1 = _mm512_setzero_si512(), vmax2 = _mm512_setzero_si512();
  // pass 1 of block b (into buf[b & 1]), 64 elements from k on
  const auto moments_at = [&](int64_t b, int64_t k) {
    const int64_t base = b * blocksize;
    moments64<G, Fused>(g + base, s1 + base, s2 + base, k, maps, h, vold1, vold2, order, buf[b & 1].m,
                        buf[b & 1].v, vmax1, vmax2, p_at(base), sizeof(P));
  };
  for (int64_t k = 0; k < blocksize; k += 64) moments_at(b0, k);
  for (int64_t b = b0; b < b1; ++b) {
    Buffers& cur = buf[b & 1];
    const int64_t base = b * blocksize;
    // block b's new scales, or the block redone with the non-finite rule
    const uint32_t bits1 = _mm512_reduce_max_epu32(vmax1), bits2 = _mm512_reduce_max_epu32(vmax2);
    bool reset = false;
    if (bits1 >= 0x7f800000u || bits2 >= 0x7f800000u) {
      reset = moments_block<G, Fused>(g + base, s1 + base, s2 + base, 0, blocksize, maps, h, cur, kAvx2, absmax1[b],
                                      absmax2[b], p_at(base), sizeof(P));
    } else {
      absmax1[b] = float_of(bits1);
      absmax2[b] = float_of(bits2);
    }
    const float inv1 = absmax1[b] > 0.0f ? 1.0f / absmax1[b] : 0.0f;
    const float inv2 = absmax2[b] > 0.0f ? 1.0f / absmax2[b] : 0.0f;
    const bool has_next = b + 1 < b1;
    if (has_next) {
      vold1 = _mm512_set1_ps(absmax1[b + 1]);
      vold2 = _mm512_set1_ps(absmax2[b + 1]);
      vmax1 = vmax2 = _mm512_setzero_si512();
    }
    if (reset || !is_finite(inv1) || !is_finite(inv2)) {  // rare: block b on its own, then block b + 1's pass 1
      if (Exact) sqrt_of(cur.v, cur.sqrt_v, blocksize);
      param_and_codes_block<P, Exact>(reset, p + base, s1 + base, s2 + base, 0, blocksize, absmax1[b], absmax2[b],
                                      maps, h, cur, kAvx512);
      if (has_next) {
        for (int64_t k = 0; k < blocksize; k += 64) moments_at(b + 1, k);
      }
      continue;
    }
    const __m512 vinv1 = _mm512_set1_ps(inv1), vinv2 = _mm512_set1_ps(inv2);
    const auto param_and_codes_at = [&](int64_t k) {
      param_and_codes64<P, Exact, false, Root>(p + base, s1 + base, s2 + base, k, cur.m, cur.v, cur.sqrt_v, vinv1,
                                               vinv2, maps, h);
    };
    if (has_next) {
      for (int64_t k = 0; k < blocksize; k += 64) {
        moments_at(b + 1, k);
        param_and_codes_at(k);
      }
    } else {
      for (int64_t k = 0; k < blocksize; k += 64) param_and_codes_at(k);
    }
  }
}
#endif

// ---- one step as items, over OpenMP threads --------------------------------------------------
// One tensor's arguments (its hyperparameters depend on its own step count).
struct TensorArgs {
  void* p;
  const void* g;
  uint8_t* s1;
  uint8_t* s2;
  float* absmax1;
  float* absmax2;
  int64_t n;
  Hyper h;
};

// What the whole call shares: the block size, the maps, the sqrt, the SIMD level.
struct Shared {
  int64_t blocksize;
  const Maps* maps;
  Sqrt sqrt_of;
  int simd;
};

// Whether a tensor's blocks go through step_pipelined (else through tiles: step_tile).
inline bool pipelined(const Shared& sh, bool exact) {
#if ADAM8_AVX512 && defined(__AVX512VBMI__)
  return sh.simd == kAvx512 && sh.blocksize % 64 == 0 && (!exact || sh.sqrt_of.root != kRootCall);
#else
  (void)sh, (void)exact;
  return false;
#endif
}

// A tensor's step cut into `items` pieces that threads take as they become free: runs of
// `per_item` whole blocks (pipelined) or of `per_item` tiles, and for the pipelined loops one
// more item for a partial last block. Smaller runs for smaller tensors: at least four per
// thread when there are enough blocks.
struct Work {
  TensorArgs t;
  bool pipelined;
  int64_t per_item, items;
  void (*run)(const Work&, const Shared&, int64_t item, Buffers buf[2]);
};

template <typename P, typename G, bool Fused, bool Exact>
void run_item(const Work& w, const Shared& sh, int64_t item, Buffers buf[2]) {
  const TensorArgs& t = w.t;
  P* p = static_cast<P*>(t.p);
  const G* g = static_cast<const G*>(t.g);
  const int64_t bs = sh.blocksize;
#if ADAM8_AVX512 && defined(__AVX512VBMI__)
  if (w.pipelined) {
    const int64_t whole = t.n / bs;
    const int64_t b0 = item * w.per_item;
    if (b0 < whole) {
      const int64_t b1 = std::min(whole, b0 + w.per_item);
      if (Exact && sh.sqrt_of.root == kRootSse) {  // (the fast mode has no use for MKL's root)
        step_pipelined<P, G, Fused, Exact, kRootSse>(p, g, t.s1, t.s2, t.absmax1, t.absmax2, b0, b1, bs, *sh.maps, t.h,
                                                     sh.sqrt_of, buf);
      } else {
        step_pipelined<P, G, Fused, Exact, kRootAvx512>(p, g, t.s1, t.s2, t.absmax1, t.absmax2, b0, b1, bs, *sh.maps,
                                                        t.h, sh.sqrt_of, buf);
      }
    } else {  // the partial last block
      const int64_t start = whole * bs;
      step_tile<P, G, Fused, Exact>(p + start, g + start, t.s1 + start, t.s2 + start, t.absmax1 + whole,
                                    t.absmax2 + whole, t.n - start, bs, *sh.maps, t.h, sh.sqrt_of, buf[0], sh.simd);
    }
    return;
  }
#endif
  const int64_t blocks_per_tile = std::max<int64_t>(1, kTile / bs);
  const int64_t tile = blocks_per_tile * bs;
  const int64_t tiles = (t.n + tile - 1) / tile;
  for (int64_t k = item * w.per_item; k < std::min(tiles, (item + 1) * w.per_item); ++k) {
    const int64_t start = k * tile;
    step_tile<P, G, Fused, Exact>(p + start, g + start, t.s1 + start, t.s2 + start, t.absmax1 + k * blocks_per_tile,
                                  t.absmax2 + k * blocks_per_tile, std::min(tile, t.n - start), bs, *sh.maps, t.h,
                                  sh.sqrt_of, buf[0], sh.simd);
  }
}

template <typename P, typename G>
Work plan(const TensorArgs& t, const Shared& sh, bool fused, bool exact, int team) {
  Work w{t, pipelined(sh, exact), 1, 0, nullptr};
  if (fused) {
    w.run = exact ? run_item<P, G, true, true> : run_item<P, G, true, false>;
  } else {
    w.run = exact ? run_item<P, G, false, true> : run_item<P, G, false, false>;
  }
  const int64_t bs = sh.blocksize;
  if (w.pipelined) {
    const int64_t whole = t.n / bs;
    w.per_item = std::max<int64_t>(1, std::min(kRun / bs, (whole + 4 * team - 1) / (4 * team)));
    w.items = (whole + w.per_item - 1) / w.per_item + (whole * bs < t.n ? 1 : 0);
  } else {
    const int64_t tile = std::max<int64_t>(1, kTile / bs) * bs;
    const int64_t tiles = (t.n + tile - 1) / tile;
    w.per_item = std::max<int64_t>(1, std::min(kRun / tile, tiles / (4 * team)));
    w.items = (tiles + w.per_item - 1) / w.per_item;
  }
  return w;
}

// Every item of every tensor in one parallel region (one tensor, or a parameter group's):
// item k of the concatenation is found from `first` (tensor i's items start at first[i]);
// the dynamic schedule hands items out in increasing order, so each thread's cursor only
// moves forward.
void run_all(const std::vector<Work>& works, const Shared& sh, int team) {
  std::vector<int64_t> first(works.size() + 1, 0);
  for (size_t i = 0; i < works.size(); ++i) first[i + 1] = first[i] + works[i].items;
  const int64_t total = first.back();
  if (total == 0) return;
#pragma omp parallel num_threads(team)
  {
    Buffers buf[2];
    int64_t cur = 0;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < total; ++k) {
      while (k >= first[cur + 1]) ++cur;
      const Work& w = works[cur];
      w.run(w, sh, k - first[cur], buf);
    }
  }
}

using PlanFn = Work (*)(const TensorArgs&, const Shared&, bool, bool, int);

}  // namespace

// dtype codes shared with cpu.py
enum : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

namespace {
// the planner for a dtype pair the loops are built for (p fp32, bf16 or fp16; g of p's dtype
// or fp32), else nullptr
PlanFn plan_for(int p_dtype, int g_dtype) {
  const bool same = g_dtype == p_dtype;
  if (!same && g_dtype != kFloat32) return nullptr;
  switch (p_dtype) {
    case kFloat32: return plan<float, float>;
    case kBFloat16: return same ? plan<BF16, BF16> : plan<BF16, float>;
    case kFloat16: return same ? plan<_Float16, _Float16> : plan<_Float16, float>;
    default: return nullptr;
  }
}

// Whether this build computes MKL's root `root` (Root) inline with loops of level `simd`: the
// AVX-512 algorithm needs the AVX-512 loops, the SSE one AVX2.
bool inline_root_built(int root, int simd) {
  return (root == kRootAvx512 && ADAM8_AVX512 && simd >= kAvx512) || (root == kRootSse && ADAM8_AVX2 && simd >= kAvx2);
}

// How a call computes MKL's root (torch's sqrt being MKL's: `mkl_sqrt` not null): inline, by the
// algorithm `mkl_sqrt_inline`, where this build has its loops at level `simd` and denormals are not
// flushed (MKL runs with FTZ/DAZ off); else by calling vmsSqrt (kRootCall).
int root_for_call(const void* mkl_sqrt, int mkl_sqrt_inline, int simd) {
#if ADAM8_AVX2
  if (mkl_sqrt != nullptr && inline_root_built(mkl_sqrt_inline, std::clamp(simd, 0, kBestSimd)) &&
      (_mm_getcsr() & 0x8040u) == 0) {
    return mkl_sqrt_inline;
  }
#else
  (void)mkl_sqrt;
  (void)mkl_sqrt_inline;
  (void)simd;
#endif
  return kRootCall;
}
}  // namespace

// the widest SIMD loops in this build: 0 none (scalar only), 1 AVX2, 2 AVX-512
extern "C" int adam8bit_cpu_simd_level() { return kBestSimd; }

// MKL's sqrt computed inline on n floats, by its AVX-512 algorithm (root = 1) or its SSE one
// (root = 2; Root), as the step computes it with this build's widest loops; -1 if this build
// cannot (root = 1 needs AVX-512, root = 2 AVX2)
extern "C" int adam8bit_cpu_mkl_sqrt_inline(const float* in, float* out, int64_t n, int root) {
  if (!inline_root_built(root, kBestSimd)) return -1;
  const Sqrt sqrt_of{nullptr, 0, root};
  sqrt_of(in, out, n);
  return 0;
}

// The SSE algorithm on 8 lanes (what AVX2-only builds use), so that the tests check it on any
// machine with AVX2; -1 without AVX2
extern "C" int adam8bit_cpu_mkl_sqrt_sse8(const float* in, float* out, int64_t n) {
#if ADAM8_AVX2
  mkl_sqrt8_sse_roots(in, out, n);
  return 0;
#else
  (void)in, (void)out, (void)n;
  return -1;
#endif
}

// 1 if the AVX-512 loops dequantize with byte shuffles (AVX-512 VBMI), 0 if with gathers
extern "C" int adam8bit_cpu_byte_planes() {
#if ADAM8_AVX512
  return kBytePlanes ? 1 : 0;
#else
  return 0;
#endif
}

// The same step for `count` tensors in one call (an optimizer's parameter group, so that Python
// is crossed once per group instead of once per tensor). Entry i of each array belongs to tensor
// i; decay, bc2_sqrt, neg_step_size and inv_bc2_sqrt are per tensor because they depend on its
// step count. The arguments of every tensor are checked before any tensor is changed; each
// tensor is then stepped exactly as adam8bit_step_cpu steps it, all of them in one parallel
// region (run_all). Returns 0, or -(1 + i) if tensor i has an unsupported dtype (nothing changed).
extern "C" int adam8bit_step_cpu_many(int64_t count, void* const* p, const void* const* g, const int* p_dtype,
                                      const int* g_dtype, uint8_t* const* state1, uint8_t* const* state2,
                                      float* const* absmax1, float* const* absmax2, const int64_t* n,
                                      int64_t blocksize, const float* qmap1, const int32_t* steps1, int nan_code1,
                                      const float* qmap2, const int32_t* steps2, int nan_code2, float beta1,
                                      float one_minus_beta1, float beta2, float one_minus_beta2, const float* decay,
                                      const float* bc2_sqrt, float eps, const float* neg_step_size,
                                      const float* inv_bc2_sqrt, int fused, int exact, void* mkl_sqrt,
                                      int64_t mkl_sqrt_mode, int mkl_sqrt_inline, int simd, int threads) {
  if (blocksize <= 0 || blocksize > kMaxBlocksize) return -1;
  for (int64_t i = 0; i < count; ++i) {
    if (plan_for(p_dtype[i], g_dtype[i]) == nullptr) return static_cast<int>(-(1 + i));
  }
  if (count <= 0) return 0;
  CallMaps call_maps(qmap1, steps1, nan_code1, qmap2, steps2, nan_code2);
  Maps& maps = call_maps.maps;
  const int root = root_for_call(mkl_sqrt, mkl_sqrt_inline, simd);
  const Shared sh{blocksize, &maps, Sqrt{reinterpret_cast<Sqrt::VmsSqrt>(mkl_sqrt), mkl_sqrt_mode, root},
                  std::clamp(simd, 0, kBestSimd)};
  threads = std::max(1, threads);
  int64_t elements = 0;
  for (int64_t i = 0; i < count; ++i) elements += n[i];
  const int team = elements < (int64_t{1} << 15) ? 1 : threads;
  std::vector<Work> works(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const Hyper h{beta1, one_minus_beta1, beta2, one_minus_beta2, decay[i], bc2_sqrt[i], eps, neg_step_size[i],
                  inv_bc2_sqrt[i]};
    const TensorArgs t{p[i], g[i], state1[i], state2[i], absmax1[i], absmax2[i], n[i], h};
    works[i] = plan_for(p_dtype[i], g_dtype[i])(t, sh, fused != 0, exact != 0, team);
  }
  run_all(works, sh, team);
  return 0;
}

// The entry point cpu.py calls (ctypes). Every scalar is passed by value (no pointer into a
// temporary Python object); the pointers are the tensors' data, which the caller keeps alive.
// g has p's dtype, or is fp32. steps1/2: the nearest-code tables. fused: torch rounds its
// multiply-adds fused. exact: 1 = torch's operations (bit-identical to the reference), 0 = the
// fast mode (IEEE sqrt, multiply by 1/sqrt(1-beta2^t)). mkl_sqrt: MKL's vmsSqrt if torch.sqrt
// uses it, else null. simd: which loops to run (Simd; capped at kBestSimd).
// Returns 0, or -1 for an unsupported dtype or blocksize.
extern "C" int adam8bit_step_cpu(void* p, const void* g, int p_dtype, int g_dtype, uint8_t* state1,
                                 uint8_t* state2, float* absmax1, float* absmax2, int64_t n, int64_t blocksize,
                                 const float* qmap1, const int32_t* steps1, int nan_code1, const float* qmap2,
                                 const int32_t* steps2, int nan_code2, float beta1, float one_minus_beta1,
                                 float beta2, float one_minus_beta2, float decay, float bc2_sqrt, float eps,
                                 float neg_step_size, float inv_bc2_sqrt, int fused, int exact, void* mkl_sqrt,
                                 int64_t mkl_sqrt_mode, int mkl_sqrt_inline, int simd, int threads) {
  return adam8bit_step_cpu_many(1, &p, &g, &p_dtype, &g_dtype, &state1, &state2, &absmax1, &absmax2, &n, blocksize,
                                qmap1, steps1, nan_code1, qmap2, steps2, nan_code2, beta1, one_minus_beta1, beta2,
                                one_minus_beta2, &decay, &bc2_sqrt, eps, &neg_step_size, &inv_bc2_sqrt, fused, exact,
                                mkl_sqrt, mkl_sqrt_mode, mkl_sqrt_inline, simd, threads) == 0
             ? 0
             : -1;
}

// =============================================================================================
// The 4-bit formats ("4bit", "4bit-naive"; adam8lib/kernels/cpu_lowbit.py): the 8-bit kernel's
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
// Tensors of three or more dimensions (rank-1 over every axis) never come here: cpu_lowbit.py
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

// One step of a 4-bit format, exact (bit-identical to LowBitAdam's reference step), in place.
// rows, cols: v's rank-1 shape (rows = 0: v blockwise, like m). The other arguments as
// adam8bit_step_cpu's. Returns 0, or -1 for an unsupported dtype, blocksize or shape.
extern "C" int adam4bit_step_cpu(void* p, const void* g, int p_dtype, int g_dtype, uint8_t* state1, uint8_t* state2,
                                 float* absmax1, float* absmax2, int64_t n, int64_t blocksize, int64_t rows,
                                 int64_t cols, const float* qmap1, const int32_t* steps1, int nan_code1,
                                 const float* qmap2, const int32_t* steps2, int nan_code2, float beta1,
                                 float one_minus_beta1, float beta2, float one_minus_beta2, float decay,
                                 float bc2_sqrt, float eps, float neg_step_size, int fused, void* mkl_sqrt,
                                 int64_t mkl_sqrt_mode, int mkl_sqrt_inline, int simd, int threads) {
  if (blocksize < 64 || blocksize > kMaxBlocksize || blocksize % 2 != 0 || n < 0) return -1;
  if (rows < 0 || cols < 0 || (rows != 0 && rows * cols != n)) return -1;
  if (n == 0) return 0;
  const int root = root_for_call(mkl_sqrt, mkl_sqrt_inline, simd);
  const Sqrt sqrt_of{reinterpret_cast<Sqrt::VmsSqrt>(mkl_sqrt), mkl_sqrt_mode, root};
  std::vector<float> old2;
  if (rows != 0) old2.assign(absmax2, absmax2 + rows + cols);
  const Hyper h{beta1, one_minus_beta1, beta2, one_minus_beta2, decay, bc2_sqrt, eps, neg_step_size, 0.0f};
  CallMaps call_maps(qmap1, steps1, nan_code1, qmap2, steps2, nan_code2);
  Maps& maps = call_maps.maps;
  const Step4 a{p, g, state1, state2, absmax1, absmax2, rows != 0 ? old2.data() : absmax2, n, blocksize, rows, cols,
                maps.t1, maps.t2, h, &maps, std::clamp(simd, 0, kBestSimd)};
  const int team = n < (int64_t{1} << 15) ? 1 : std::max(1, threads);
  const bool same = g_dtype == p_dtype;
  if (!same && g_dtype != kFloat32) return -1;
  switch (p_dtype) {
    case kFloat32: step4_dispatch<float, float>(a, fused != 0, sqrt_of, team); return 0;
    case kBFloat16:
      same ? step4_dispatch<BF16, BF16>(a, fused != 0, sqrt_of, team) : step4_dispatch<BF16, float>(a, fused != 0, sqrt_of, team);
      return 0;
    case kFloat16:
      same ? step4_dispatch<_Float16, _Float16>(a, fused != 0, sqrt_of, team)
           : step4_dispatch<_Float16, float>(a, fused != 0, sqrt_of, team);
      return 0;
    default: return -1;
  }
}
