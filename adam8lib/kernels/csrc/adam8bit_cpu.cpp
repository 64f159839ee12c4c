// The 8-bit Adam step on the CPU: OpenMP threads over tiles of blocks, AVX2 inside a block.
//
// Plain C++ (no torch headers, so it builds in seconds). adam8lib/kernels/cpu.py builds it
// with -O3 -march=native -fopenmp -ffp-contract=off, checks every argument, and calls
// adam8bit_step_cpu (bottom of this file) through ctypes with the tensors' data pointers.
//
// It computes exactly what adam8lib/kernels/reference.py computes, with the same fp32
// operations in the same order, so codes and absmax are bit-identical. Work goes by tiles
// (whole blocks, ~2048 elements; one block if blocks are larger) and makes two passes over
// per-thread buffers that stay in cache:
//   1. each block:  m = qmap1[state1] * absmax1        v = qmap2[state2] * absmax2   (dequantize)
//                   m = m * beta1 + (1 - beta1) * g     v = v * beta2 + (1 - beta2) * g * g
//                   non-finite g: m = v = 0;  new absmax1 = max |m|, new absmax2 = max v
//   2. sqrt(v) for the whole tile, then each block:
//                   p = p * (1 - lr*wd) + (-step_size * m) / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//                   (non-finite g: p is left as it was)
//                   state1 = nearest code of m * (1/absmax1), state2 = that of v * (1/absmax2)
//                   (keeping signs: a non-zero value never gets the code of 0 or of the other sign)
//
// Each loop is written twice: scalar (the spec, readable; also a block's last n % 8 elements,
// blocks whose scales are not finite, and CPUs without AVX2), and AVX2, 8 elements at a
// time with the same operations in the same order (the `*8` functions). The tests run both.
//
// Rounding that matters for bit-identity (cpu.py asks this torch build and passes flags):
// * torch computes m.add_(g, alpha=a) as fma(g, a, m) and v.addcmul_(g, g, value=b) as
//   fma(b*g, g, v) on AVX2/AVX-512 builds (`fused`). Every other operation is rounded
//   separately, hence -ffp-contract=off: the compiler must not fuse a*b+c by itself.
// * torch.sqrt on x86 Linux wheels is Intel MKL's vmsSqrt (within 1 ulp, but about 1 in 6
//   results is not the correctly rounded one); then this kernel calls the same function.
//
// Nearest code without searching the 256-entry map: the reference's nearest_code(x) is a
// step function of x. cpu.py samples it exactly into a table indexed by the top 16
// bits of a sortable key of x (a "bucket"). Each entry packs three numbers: the code at the
// bucket's start (bits 0-7), the step to the one other code inside the bucket (bits 8-15,
// modulo 256, mostly 0 or 1) and the low 16 bits of the key where it happens (bits 16-31):
//     code(x) = base + (low 16 bits of key(x) >= where ? step : 0)   (mod 256)
// one table load and one integer compare; NaN gets the reference's code for NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

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

// A float's bits as a signed integer that sorts like the float: non-negative floats keep
// their bits, negative ones get the 31 low bits flipped (so more negative = smaller).
inline int32_t sortable_key(float x) {
  const int32_t s = static_cast<int32_t>(bits_of(x));
  return s ^ ((s >> 31) & 0x7fffffff);
}
// Its top 16 bits, as a table index 0..65535.
inline int32_t bucket_of(int32_t key) { return (key >> 16) + 0x8000; }
inline int32_t low16(int32_t key) { return key & 0xffff; }

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
  const float* qmap;     // 256 map values, sorted
  const int32_t* steps;  // 65536 buckets: base | step << 8 | where << 16
  int32_t nan_code;      // the reference's code for NaN
};

inline uint8_t nearest_code(float x, const CodeTable& t) {
  const int32_t key = sortable_key(x);
  const uint32_t entry = static_cast<uint32_t>(t.steps[bucket_of(key)]);
  const uint32_t base = entry & 0xff, step = (entry >> 8) & 0xff, where = entry >> 16;
  const uint32_t code = base + (static_cast<uint32_t>(low16(key)) >= where ? step : 0);
  return static_cast<uint8_t>(x != x ? t.nan_code : static_cast<int32_t>(code));
}

// fp32 hyperparameters, rounded from Python's floats by cpu.py (as torch rounds its scalars)
struct Hyper {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;          // 1 - lr * weight_decay
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
};

// sqrt of n floats as torch.sqrt computes it here: IEEE sqrt, or MKL's vmsSqrt
struct Sqrt {
  using VmsSqrt = void (*)(int n, const float* in, float* out, int64_t mode);
  VmsSqrt mkl;   // nullptr: IEEE sqrt
  int64_t mode;  // the VML mode torch passes (VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE)
  void operator()(const float* in, float* out, int64_t n) const {
    if (mkl != nullptr) {
      mkl(static_cast<int>(n), in, out, mode);
      return;
    }
    for (int64_t i = 0; i < n; ++i) out[i] = std::sqrt(in[i]);
  }
};

// ---- the three per-element steps, scalar --------------------------------------------------
// 1. dequantize, update the moments (Fused: as torch's fused multiply-adds)
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
  const bool finite = is_finite(grad);
  m_out = finite ? m : 0.0f;
  v_out = finite ? v : 0.0f;
}

// 2. the parameter update
template <bool Decay>
inline float update_param(float param, float m, float sqrt_v, bool finite, const Hyper& h) {
  float updated = Decay ? param * h.decay : param;
  const float denom = sqrt_v / h.bc2_sqrt + h.eps;
  updated = updated + (h.neg_step_size * m) / denom;
  return finite ? updated : param;
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
inline __m256 non_finite8(__m256 x) {
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), exp_mask), exp_mask));
}
inline __m256i load_codes8(const uint8_t* s) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
}
inline void store_codes8(uint8_t* s, __m256i codes) {  // 8 int32 in 0..255 -> 8 bytes
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(s), _mm_packus_epi16(words, words));
}

template <bool Fused>
inline void update_moments8(__m256 grad, __m256i c1, __m256i c2, __m256 old_absmax1, __m256 old_absmax2,
                            const CodeTable& t1, const CodeTable& t2, const Hyper& h, __m256& m_out,
                            __m256& v_out) {
  __m256 m = _mm256_mul_ps(_mm256_i32gather_ps(t1.qmap, c1, 4), old_absmax1);
  __m256 v = _mm256_mul_ps(_mm256_i32gather_ps(t2.qmap, c2, 4), old_absmax2);
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
  const __m256 bad = non_finite8(grad);
  m_out = _mm256_andnot_ps(bad, m);
  v_out = _mm256_andnot_ps(bad, v);
}

template <bool Decay>
inline __m256 update_param8(__m256 param, __m256 m, __m256 sqrt_v, __m256 bad_grad, const Hyper& h) {
  __m256 updated = Decay ? _mm256_mul_ps(param, _mm256_set1_ps(h.decay)) : param;
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(sqrt_v, _mm256_set1_ps(h.bc2_sqrt)), _mm256_set1_ps(h.eps));
  updated = _mm256_add_ps(updated, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(h.neg_step_size), m), denom));
  return _mm256_blendv_ps(updated, param, bad_grad);
}

inline __m256i nearest_code8(__m256 x, const CodeTable& t) {  // x must not be NaN
  const __m256i s = _mm256_castps_si256(x);
  const __m256i key = _mm256_xor_si256(s, _mm256_and_si256(_mm256_srai_epi32(s, 31), _mm256_set1_epi32(0x7fffffff)));
  const __m256i bucket = _mm256_add_epi32(_mm256_srai_epi32(key, 16), _mm256_set1_epi32(0x8000));
  const __m256i entry = _mm256_i32gather_epi32(t.steps, bucket, 4);
  const __m256i byte = _mm256_set1_epi32(0xff);
  const __m256i base = _mm256_and_si256(entry, byte);
  const __m256i step = _mm256_and_si256(_mm256_srli_epi32(entry, 8), byte);
  const __m256i where = _mm256_srli_epi32(entry, 16);
  const __m256i below = _mm256_cmpgt_epi32(where, _mm256_and_si256(key, _mm256_set1_epi32(0xffff)));
  return _mm256_and_si256(_mm256_add_epi32(base, _mm256_andnot_si256(below, step)), byte);  // mod 256, as uint8
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
inline __mmask16 non_finite16(__m512 x) {
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), exp_mask), exp_mask);
}
inline __m512i load_codes16(const uint8_t* s) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)));
}
inline void store_codes16(uint8_t* s, __m512i codes) {  // 16 int32 in 0..255 -> 16 bytes
  _mm_storeu_si128(reinterpret_cast<__m128i*>(s), _mm512_cvtepi32_epi8(codes));
}

template <bool Fused>
inline void update_moments16(__m512 grad, __m512i c1, __m512i c2, __m512 old_absmax1, __m512 old_absmax2,
                             const CodeTable& t1, const CodeTable& t2, const Hyper& h, __m512& m_out,
                             __m512& v_out) {
  __m512 m = _mm512_mul_ps(_mm512_i32gather_ps(c1, t1.qmap, 4), old_absmax1);
  __m512 v = _mm512_mul_ps(_mm512_i32gather_ps(c2, t2.qmap, 4), old_absmax2);
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
  const __mmask16 good = static_cast<__mmask16>(~non_finite16(grad));
  m_out = _mm512_maskz_mov_ps(good, m);
  v_out = _mm512_maskz_mov_ps(good, v);
}

template <bool Decay>
inline __m512 update_param16(__m512 param, __m512 m, __m512 sqrt_v, __mmask16 bad_grad, const Hyper& h) {
  __m512 updated = Decay ? _mm512_mul_ps(param, _mm512_set1_ps(h.decay)) : param;
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(sqrt_v, _mm512_set1_ps(h.bc2_sqrt)), _mm512_set1_ps(h.eps));
  updated = _mm512_add_ps(updated, _mm512_div_ps(_mm512_mul_ps(_mm512_set1_ps(h.neg_step_size), m), denom));
  return _mm512_mask_blend_ps(bad_grad, updated, param);
}

inline __m512i nearest_code16(__m512 x, const CodeTable& t) {  // x must not be NaN
  const __m512i s = _mm512_castps_si512(x);
  const __m512i key = _mm512_xor_si512(s, _mm512_and_si512(_mm512_srai_epi32(s, 31), _mm512_set1_epi32(0x7fffffff)));
  const __m512i bucket = _mm512_add_epi32(_mm512_srai_epi32(key, 16), _mm512_set1_epi32(0x8000));
  const __m512i entry = _mm512_i32gather_epi32(bucket, t.steps, 4);
  const __m512i byte = _mm512_set1_epi32(0xff);
  const __m512i base = _mm512_and_si512(entry, byte);
  const __m512i step = _mm512_and_si512(_mm512_srli_epi32(entry, 8), byte);
  const __mmask16 at_or_after = _mm512_cmpge_epi32_mask(_mm512_and_si512(key, _mm512_set1_epi32(0xffff)),
                                                        _mm512_srli_epi32(entry, 16));
  return _mm512_and_si512(_mm512_mask_add_epi32(base, at_or_after, base, step), byte);  // mod 256, as uint8
}
#endif

// ---- one tile: a run of whole blocks ---------------------------------------------------------
// Tables and hyperparameters are passed by value: stores through uint8_t* may alias anything,
// so fields read through a reference would be reloaded in every loop.
constexpr int64_t kTile = 2048;  // elements per tile when blocks are smaller (one sqrt call each)

struct Buffers {  // per-thread scratch for one tile; stays in cache
  alignas(64) float m[kMaxBlocksize];
  alignas(64) float v[kMaxBlocksize];
  alignas(64) float sqrt_v[kMaxBlocksize];
};

inline bool finite(float x) { return is_finite(x); }

// Pass 1 for the block [lo, hi): new m and v into buf; absmax1/absmax2 come in as the old
// scales and go out as the new ones (max |m|, max v; NaN if any is NaN, like torch's amax).
template <typename G, bool Fused>
void moments_block(const G* __restrict g, const uint8_t* __restrict s1, const uint8_t* __restrict s2, int64_t lo,
                   int64_t hi, const CodeTable t1, const CodeTable t2, const Hyper h, Buffers& buf, int simd,
                   float& absmax1, float& absmax2) {
  const float old1 = absmax1, old2 = absmax2;
  float max1 = 0.0f, max2 = 0.0f;
  bool nan1 = false, nan2 = false;
  int64_t i = lo;
  // with finite old scales no m or v can be NaN, so the SIMD loops only need the max
  const bool vector = simd != kScalar && finite(old1) && finite(old2);
#if ADAM8_AVX512
  if (vector && simd == kAvx512) {
    __m512 vmax1 = _mm512_setzero_ps(), vmax2 = _mm512_setzero_ps();
    for (; i + 16 <= hi; i += 16) {
      __m512 m, v;
      update_moments16<Fused>(load16(g + i), load_codes16(s1 + i), load_codes16(s2 + i), _mm512_set1_ps(old1),
                              _mm512_set1_ps(old2), t1, t2, h, m, v);
      _mm512_store_ps(buf.m + i, m);
      _mm512_store_ps(buf.v + i, v);
      vmax1 = _mm512_max_ps(_mm512_abs_ps(m), vmax1);
      vmax2 = _mm512_max_ps(_mm512_abs_ps(v), vmax2);
    }
    max1 = _mm512_reduce_max_ps(vmax1);
    max2 = _mm512_reduce_max_ps(vmax2);
  }
#endif
#if ADAM8_AVX2
  if (vector) {
    __m256 vmax1 = _mm256_setzero_ps(), vmax2 = _mm256_setzero_ps();
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (; i + 8 <= hi; i += 8) {
      __m256 m, v;
      update_moments8<Fused>(load8(g + i), load_codes8(s1 + i), load_codes8(s2 + i), _mm256_set1_ps(old1),
                             _mm256_set1_ps(old2), t1, t2, h, m, v);
      _mm256_store_ps(buf.m + i, m);
      _mm256_store_ps(buf.v + i, v);
      vmax1 = _mm256_max_ps(_mm256_and_ps(m, abs_mask), vmax1);
      vmax2 = _mm256_max_ps(_mm256_and_ps(v, abs_mask), vmax2);
    }
    max1 = std::max(max1, max8(vmax1));
    max2 = std::max(max2, max8(vmax2));
  }
#endif
  for (; i < hi; ++i) {
    update_moments<Fused>(to_float(g[i]), s1[i], s2[i], old1, old2, t1, t2, h, buf.m[i], buf.v[i]);
    const float abs_m = std::fabs(buf.m[i]), abs_v = std::fabs(buf.v[i]);
    max1 = std::max(max1, abs_m);
    max2 = std::max(max2, abs_v);
    nan1 |= abs_m != abs_m;
    nan2 |= abs_v != abs_v;
  }
  absmax1 = nan1 ? std::numeric_limits<float>::quiet_NaN() : max1;
  absmax2 = nan2 ? std::numeric_limits<float>::quiet_NaN() : max2;
}

// Pass 2 for the block [lo, hi): update p, and requantize m and v with the new scales
// (multiplying by 1/absmax, as the reference does).
template <typename P, typename G, bool Decay>
void param_and_codes_block(P* __restrict p, const G* __restrict g, uint8_t* __restrict s1, uint8_t* __restrict s2,
                           int64_t lo, int64_t hi, float absmax1, float absmax2, const CodeTable t1,
                           const CodeTable t2, const Hyper h, const Buffers& buf, int simd) {
  const float inv1 = absmax1 > 0.0f ? 1.0f / absmax1 : 0.0f;
  const float inv2 = absmax2 > 0.0f ? 1.0f / absmax2 : 0.0f;
  int64_t i = lo;
  // finite scales and inverses: m * inv1 and v * inv2 are never NaN, so no NaN case here
  const bool vector = simd != kScalar && finite(absmax1) && finite(absmax2) && finite(inv1) && finite(inv2);
#if ADAM8_AVX512
  if (vector && simd == kAvx512) {
    for (; i + 16 <= hi; i += 16) {
      const __m512 m = _mm512_load_ps(buf.m + i), v = _mm512_load_ps(buf.v + i);
      store16(p + i, update_param16<Decay>(load16(p + i), m, _mm512_load_ps(buf.sqrt_v + i), non_finite16(load16(g + i)), h));
      store_codes16(s1 + i, nearest_code16(_mm512_mul_ps(m, _mm512_set1_ps(inv1)), t1));
      store_codes16(s2 + i, nearest_code16(_mm512_mul_ps(v, _mm512_set1_ps(inv2)), t2));
    }
  }
#endif
#if ADAM8_AVX2
  if (vector) {
    for (; i + 8 <= hi; i += 8) {
      const __m256 m = _mm256_load_ps(buf.m + i), v = _mm256_load_ps(buf.v + i);
      store8(p + i, update_param8<Decay>(load8(p + i), m, _mm256_load_ps(buf.sqrt_v + i), non_finite8(load8(g + i)), h));
      store_codes8(s1 + i, nearest_code8(_mm256_mul_ps(m, _mm256_set1_ps(inv1)), t1));
      store_codes8(s2 + i, nearest_code8(_mm256_mul_ps(v, _mm256_set1_ps(inv2)), t2));
    }
  }
#endif
  for (; i < hi; ++i) {
    p[i] = from_float<P>(update_param<Decay>(to_float(p[i]), buf.m[i], buf.sqrt_v[i], is_finite(to_float(g[i])), h));
    s1[i] = nearest_code(buf.m[i] * inv1, t1);
    s2[i] = nearest_code(buf.v[i] * inv2, t2);
  }
}

template <typename P, typename G, bool Fused, bool Decay>
void step_tile(P* __restrict p, const G* __restrict g, uint8_t* __restrict s1, uint8_t* __restrict s2,
               float* absmax1, float* absmax2, int64_t n, int64_t blocksize, const CodeTable& t1,
               const CodeTable& t2, const Hyper& h, const Sqrt& sqrt_of, Buffers& buf, int simd) {
  // 1. dequantize and update m and v, block by block (each block has its own scales)
  for (int64_t lo = 0, b = 0; lo < n; lo += blocksize, ++b) {
    moments_block<G, Fused>(g, s1, s2, lo, std::min(n, lo + blocksize), t1, t2, h, buf, simd, absmax1[b], absmax2[b]);
  }
  // 2. sqrt(v) for the whole tile, then update p and requantize, block by block
  sqrt_of(buf.v, buf.sqrt_v, n);
  for (int64_t lo = 0, b = 0; lo < n; lo += blocksize, ++b) {
    param_and_codes_block<P, G, Decay>(p, g, s1, s2, lo, std::min(n, lo + blocksize), absmax1[b], absmax2[b], t1, t2,
                                       h, buf, simd);
  }
}

// ---- all tiles, over OpenMP threads -----------------------------------------------------------
template <typename P, typename G, bool Fused, bool Decay>
void step_all(void* p_ptr, const void* g_ptr, uint8_t* s1, uint8_t* s2, float* absmax1, float* absmax2, int64_t n,
              int64_t blocksize, const CodeTable& t1, const CodeTable& t2, const Hyper& h, const Sqrt& sqrt_of,
              int simd, int threads) {
  P* p = static_cast<P*>(p_ptr);
  const G* g = static_cast<const G*>(g_ptr);
  const int64_t blocks_per_tile = std::max<int64_t>(1, kTile / blocksize);
  const int64_t tile = blocks_per_tile * blocksize;
  const int64_t tiles = (n + tile - 1) / tile;
  // small tensors stay on this thread (starting a parallel region costs microseconds)
  const int team = n < (int64_t{1} << 15) ? 1 : threads;
#pragma omp parallel num_threads(team)
  {
    Buffers buf;
#pragma omp for schedule(static)
    for (int64_t k = 0; k < tiles; ++k) {
      const int64_t start = k * tile;
      step_tile<P, G, Fused, Decay>(p + start, g + start, s1 + start, s2 + start, absmax1 + k * blocks_per_tile,
                                    absmax2 + k * blocks_per_tile, std::min(tile, n - start), blocksize, t1, t2, h,
                                    sqrt_of, buf, simd);
    }
  }
}

using StepFn = void (*)(void*, const void*, uint8_t*, uint8_t*, float*, float*, int64_t, int64_t, const CodeTable&,
                        const CodeTable&, const Hyper&, const Sqrt&, int, int);

template <typename P, typename G>
StepFn pick(bool fused, bool decay) {
  if (fused) return decay ? step_all<P, G, true, true> : step_all<P, G, true, false>;
  return decay ? step_all<P, G, false, true> : step_all<P, G, false, false>;
}

}  // namespace

// dtype codes shared with cpu.py
enum : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// the widest SIMD loops in this build: 0 none (scalar only), 1 AVX2, 2 AVX-512
extern "C" int adam8bit_cpu_simd_level() { return kBestSimd; }

// The entry point cpu.py calls (ctypes). hyper: 8 fp32 values in the order of struct Hyper.
// g has p's dtype, or is fp32. steps1/2: the nearest-code tables. mkl_sqrt: MKL's vmsSqrt if
// torch.sqrt uses it, else null. simd: which loops to run (Simd; capped at kBestSimd).
// Returns 0, or -1 for an unsupported dtype or blocksize.
extern "C" int adam8bit_step_cpu(void* p, const void* g, int p_dtype, int g_dtype, uint8_t* state1,
                                 uint8_t* state2, float* absmax1, float* absmax2, int64_t n, int64_t blocksize,
                                 const float* qmap1, const int32_t* steps1, int nan_code1, const float* qmap2,
                                 const int32_t* steps2, int nan_code2, const float* hyper, int decay, int fused,
                                 void* mkl_sqrt, int64_t mkl_sqrt_mode, int simd, int threads) {
  if (blocksize <= 0 || blocksize > kMaxBlocksize || (g_dtype != p_dtype && g_dtype != kFloat32)) return -1;
  const CodeTable t1{qmap1, steps1, nan_code1};
  const CodeTable t2{qmap2, steps2, nan_code2};
  const Hyper h{hyper[0], hyper[1], hyper[2], hyper[3], hyper[4], hyper[5], hyper[6], hyper[7]};
  const Sqrt sqrt_of{reinterpret_cast<Sqrt::VmsSqrt>(mkl_sqrt), mkl_sqrt_mode};
  const bool same = g_dtype == p_dtype;
  StepFn fn = nullptr;
  switch (p_dtype) {
    case kFloat32: fn = pick<float, float>(fused, decay); break;
    case kBFloat16: fn = same ? pick<BF16, BF16>(fused, decay) : pick<BF16, float>(fused, decay); break;
    case kFloat16: fn = same ? pick<_Float16, _Float16>(fused, decay) : pick<_Float16, float>(fused, decay); break;
    default: return -1;
  }
  fn(p, g, state1, state2, absmax1, absmax2, n, blocksize, t1, t2, h, sqrt_of, std::clamp(simd, 0, kBestSimd),
     std::max(1, threads));
  return 0;
}
