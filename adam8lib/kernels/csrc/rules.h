#pragma once

// The rule template: the elementwise update rules of the optimizer family (adam8lib/rules/: Lion,
// AdEMAMix, RMSprop, Adagrad, Adan) as fused CPU steps on byte-coded states (8-bit maps, FP8), bit for bit
// with QuantizedStateOptimizer's reference step (adam8lib/quantized_state.py).
//
// A rule has kStates states (any number: every array of the template is sized by the rule); those in the
// bit mask kKept are kept in fp32 (StateSpec(kept="fp32"): Adan's previous gradient), loaded and stored as
// floats, with no codes and no absmax; the others are byte-coded.
//
// A rule is written once, as two functions of "lanes" L (one float, 8 with AVX2, 16 with AVX-512;
// the same operations in the same order at every width, so every SIMD level gives the same bits):
//   moments(g, p, s[], aux, h)        the new states s[] from the old ones (decoded), and `aux`, a
//                                     value the parameter update needs that the new states no
//                                     longer give (Lion's sign of the interpolation)
//   param(p, g, s[], root, aux, h)    the new parameter, from the new states; `root` is the
//                                     square root, as torch computes it, of state kRoot (or unused)
// Everything else is shared and rule-free: decoding (code -> map value * the block's old absmax),
// the non-finite rule (an element whose new state is not finite has every state reset to +0 and
// keeps its parameter, as the reference's masked_fill/where), torch's square root (simd.h: IEEE, or
// MKL's vmsSqrt called per tile or computed inline), the new absmax per block (max |s|), and
// encoding with the exact nearest-code tables (codes8.h: code of s * (1/absmax), 0 for absmax 0).
//
// torch's rounding, as the reference computes each rule with torch ops (Torch<L, Fused> below):
// `x.add_(y, alpha=a)` is fma(y, a, x) and `x.addcmul_(y, z, value=c)` is fma(c*y, z, x) on AVX2 /
// AVX-512 builds of torch (Fused; cpu.py asks torch once), `x.addcdiv_(y, z, value=c)` is
// x + (c*y)/z, and every other operation (mul, div, add of two tensors, sqrt) is rounded on its own
// (-ffp-contract=off). Scalars are fp32, rounded once from Python's doubles by cpu_rules.py.
//
// A tile is a run of whole blocks (kTile elements, or one block if blocks are larger), in three
// passes over per-thread buffers that stay in cache: A) decode, moments, non-finite rule;
// B) the square root of the tile's state kRoot; C) each block: the parameter, then each coded state's
// new absmax and codes (each kept state's floats). Threads take tiles as they become free (OpenMP's dynamic schedule).

#include "adam8bit.h"

namespace {
namespace rules {

// ---- lanes --------------------------------------------------------------------------------
// V: the values, M: a mask (which elements the non-finite rule resets).
struct Lane1 {
  using V = float;
  using M = bool;
  static constexpr int kWidth = 1;
  static V set(float a) { return a; }
  static V mul(V a, V b) { return a * b; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  // torch.sign: (0 < x) - (x < 0), so +0 for +-0 and NaN
  static V sign(V a) { return static_cast<float>(a > 0.0f) - static_cast<float>(a < 0.0f); }
  template <typename T>
  static V load(const T* p) { return to_float(*p); }
  template <typename T>
  static void store(T* p, V x) { *p = from_float<T>(x); }
  static V loadf(const float* p) { return *p; }
  static void storef(float* p, V x) { *p = x; }
  static V decode(const CodeTable& t, const uint8_t* c) { return t.qmap[*c]; }
  static void encode(const CodeTable& t, uint8_t* c, V x) { *c = nearest_code(x, t); }
  static M non_finite(V x) { return !is_finite(x); }
  static M either(M a, M b) { return a || b; }
  static V zero_where(M m, V x) { return m ? 0.0f : x; }
  static V select(M m, V a, V b) { return m ? a : b; }  // a where m
  static void store_mask(int32_t* r, M m) { *r = m ? -1 : 0; }
  static M load_mask(const int32_t* r) { return *r != 0; }
  static uint32_t abs_bits(V x) { return bits_of(x) & 0x7fffffffu; }
};

#if ADAM8_AVX2
struct Lane8 {
  using V = __m256;
  using M = __m256;  // all-ones lanes
  static constexpr int kWidth = 8;
  static V set(float a) { return _mm256_set1_ps(a); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V sign(V a) {
    const V one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    return _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(zero, a, _CMP_LT_OQ), one),
                         _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), one));
  }
  template <typename T>
  static V load(const T* p) { return load8(p); }
  template <typename T>
  static void store(T* p, V x) { store8(p, x); }
  static V loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V decode(const CodeTable& t, const uint8_t* c) { return _mm256_i32gather_ps(t.qmap, load_codes8(c), 4); }
  static void encode(const CodeTable& t, uint8_t* c, V x) { store_codes8(c, nearest_code8_loads(x, t)); }
  static M non_finite(V x) { return _mm256_castsi256_ps(non_finite8(x)); }
  static M either(M a, M b) { return _mm256_or_ps(a, b); }
  static V zero_where(M m, V x) { return _mm256_andnot_ps(m, x); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static void store_mask(int32_t* r, M m) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(r), _mm256_castps_si256(m)); }
  static M load_mask(const int32_t* r) { return _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r))); }
};
#endif

#if ADAM8_AVX512
struct Lane16 {
  using V = __m512;
  using M = __mmask16;
  static constexpr int kWidth = 16;
  static V set(float a) { return _mm512_set1_ps(a); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V sign(V a) {
    const V one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
    return _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(zero, a, _CMP_LT_OQ), one),
                         _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ), one));
  }
  template <typename T>
  static V load(const T* p) { return load16(p); }
  template <typename T>
  static void store(T* p, V x) { store16(p, x); }
  static V loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V decode(const CodeTable& t, const uint8_t* c) { return _mm512_i32gather_ps(load_codes16(c), t.qmap, 4); }
  static void encode(const CodeTable& t, uint8_t* c, V x) { store_codes16(c, nearest_code16_loads(x, t)); }
  static M non_finite(V x) {
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
  }
  static M either(M a, M b) { return static_cast<M>(a | b); }
  static V zero_where(M m, V x) { return _mm512_maskz_mov_ps(static_cast<M>(~m), x); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static void store_mask(int32_t* r, M m) { _mm512_storeu_si512(r, _mm512_maskz_mov_epi32(m, _mm512_set1_epi32(-1))); }
  static M load_mask(const int32_t* r) {
    const __m512i x = _mm512_loadu_si512(r);
    return _mm512_test_epi32_mask(x, x);
  }
};
#endif

// ---- torch's operations on lanes ------------------------------------------------------------
template <class L, bool Fused>
struct Torch {
  using V = typename L::V;
  static V mul(V x, float s) { return L::mul(x, L::set(s)); }                       // x.mul(s)
  static V div(V x, float s) { return L::div(x, L::set(s)); }                       // x / s
  static V add(V x, float s) { return L::add(x, L::set(s)); }                       // x + s
  static V add_alpha(V x, V y, float a) {                                           // x.add(y, alpha=a)
    return Fused ? L::fma(y, L::set(a), x) : L::add(x, L::mul(L::set(a), y));
  }
  static V addcmul(V x, V y, V z, float c) {                                        // x.addcmul(y, z, value=c)
    const V cy = L::mul(L::set(c), y);
    return Fused ? L::fma(cy, z, x) : L::add(x, L::mul(cy, z));
  }
  static V addcdiv(V x, V y, V z, float c) { return L::add(x, L::div(L::mul(L::set(c), y), z)); }  // x.addcdiv(y, z, value=c)
};

// fp32 scalars of one step (their meaning is the rule's; cpu_rules.py fills them in this order)
struct H {
  float v[16];
};

// ---- the rules (each line: the line of adam8lib/rules/<rule>.py it mirrors) -----------------------
// Lion: h = beta1, 1 - beta1, beta2, 1 - beta2, decay (1 - lr*wd, or 1), -lr
struct Lion {
  static constexpr int kStates = 1, kRoot = -1;
  static constexpr unsigned kKept = 0;
  template <class L, bool F>
  static void moments(typename L::V g, typename L::V, typename L::V s[], typename L::V& aux, const H& h) {
    using T = Torch<L, F>;
    aux = L::sign(L::add(T::mul(s[0], h.v[0]), T::mul(g, h.v[1])));  // sign(m.mul(beta1) + g.mul(1 - beta1))
    s[0] = T::add_alpha(T::mul(s[0], h.v[2]), g, h.v[3]);             // m.mul_(beta2).add_(g, alpha=1 - beta2)
  }
  template <class L, bool F>
  static typename L::V param(typename L::V p, typename L::V, const typename L::V*, typename L::V, typename L::V aux,
                             const H& h) {
    using T = Torch<L, F>;
    return T::add_alpha(T::mul(p, h.v[4]), aux, h.v[5]);  // p.mul_(1 - lr*wd); p.add_(sign, alpha=-lr)
  }
};

// AdEMAMix: states m1 (fast), m2 (slow), nu; h = beta1, 1 - beta1, beta3_t, 1 - beta3_t, beta2, 1 - beta2,
// 1 - beta1^t, alpha_t, sqrt(1 - beta2^t), eps, decay, -lr
struct AdEMAMix {
  static constexpr int kStates = 3, kRoot = 2;
  static constexpr unsigned kKept = 0;
  template <class L, bool F>
  static void moments(typename L::V g, typename L::V, typename L::V s[], typename L::V&, const H& h) {
    using T = Torch<L, F>;
    s[0] = T::add_alpha(T::mul(s[0], h.v[0]), g, h.v[1]);   // m1.mul_(beta1).add_(g, alpha=1 - beta1)
    s[1] = T::add_alpha(T::mul(s[1], h.v[2]), g, h.v[3]);   // m2.mul_(beta3).add_(g, alpha=1 - beta3)
    s[2] = T::addcmul(T::mul(s[2], h.v[4]), g, g, h.v[5]);  // nu.mul_(beta2).addcmul_(g, g, value=1 - beta2)
  }
  template <class L, bool F>
  static typename L::V param(typename L::V p, typename L::V, const typename L::V* s, typename L::V root,
                             typename L::V, const H& h) {
    using T = Torch<L, F>;
    const typename L::V num = L::add(T::div(s[0], h.v[6]), T::mul(s[1], h.v[7]));  // m1 / c1 + alpha * m2
    const typename L::V den = T::add(T::div(root, h.v[8]), h.v[9]);                // nu.sqrt() / c2 + eps
    return T::add_alpha(T::mul(p, h.v[10]), L::div(num, den), h.v[11]);             // p.mul_(decay).add_(u, alpha=-lr)
  }
};

// RMSprop: h = weight_decay, alpha, 1 - alpha, eps, -lr
struct RMSprop {
  static constexpr int kStates = 1, kRoot = 0;
  static constexpr unsigned kKept = 0;
  template <class L, bool F>
  static void moments(typename L::V g, typename L::V p, typename L::V s[], typename L::V&, const H& h) {
    using T = Torch<L, F>;
    const typename L::V gd = T::add_alpha(g, p, h.v[0]);     // g = g.add(p, alpha=wd)
    s[0] = T::addcmul(T::mul(s[0], h.v[1]), gd, gd, h.v[2]);  // s.mul_(alpha).addcmul_(g, g, value=1 - alpha)
  }
  template <class L, bool F>
  static typename L::V param(typename L::V p, typename L::V g, const typename L::V*, typename L::V root,
                             typename L::V, const H& h) {
    using T = Torch<L, F>;
    const typename L::V gd = T::add_alpha(g, p, h.v[0]);
    return T::addcdiv(p, gd, T::add(root, h.v[3]), h.v[4]);  // p.addcdiv_(g, s.sqrt().add_(eps), value=-lr)
  }
};

// Adagrad: h = weight_decay, eps, -lr
struct Adagrad {
  static constexpr int kStates = 1, kRoot = 0;
  static constexpr unsigned kKept = 0;
  template <class L, bool F>
  static void moments(typename L::V g, typename L::V p, typename L::V s[], typename L::V&, const H& h) {
    using T = Torch<L, F>;
    const typename L::V gd = T::add_alpha(g, p, h.v[0]);  // g = g.add(p, alpha=wd)
    s[0] = T::addcmul(s[0], gd, gd, 1.0f);                 // s.addcmul_(g, g, value=1.0)
  }
  template <class L, bool F>
  static typename L::V param(typename L::V p, typename L::V g, const typename L::V*, typename L::V root,
                             typename L::V, const H& h) {
    using T = Torch<L, F>;
    const typename L::V gd = T::add_alpha(g, p, h.v[0]);
    return T::addcdiv(p, gd, T::add(root, h.v[1]), h.v[2]);  // p.addcdiv_(g, s.sqrt().add_(eps), value=-lr)
  }
};

// Adan: states m, e (EMA of g - g_prev), n, g_prev (kept in fp32); h = beta1, 1 - beta1, beta2, 1 - beta2, beta3,
// 1 - beta3, first (1 on step 1, else 0), sqrt(1 - beta3^t), eps, decay (1 - lr*wd with weight_decouple, else 1),
// -lr / (1 - beta1^t), -lr * beta2 / (1 - beta2^t), prox (1 + lr*wd without weight_decouple, else 1)
struct Adan {
  static constexpr int kStates = 4, kRoot = 2;
  static constexpr unsigned kKept = 1u << 3;
  template <class L, bool F>
  static void moments(typename L::V g, typename L::V, typename L::V s[], typename L::V&, const H& h) {
    using T = Torch<L, F>;
    const typename L::V d = L::sub(g, h.v[6] != 0.0f ? g : s[3]);  // d = g - (g if step == 1 else prev)
    s[0] = T::add_alpha(T::mul(s[0], h.v[0]), g, h.v[1]);           // m.mul_(beta1).add_(g, alpha=1 - beta1)
    s[1] = T::add_alpha(T::mul(s[1], h.v[2]), d, h.v[3]);           // e.mul_(beta2).add_(d, alpha=1 - beta2)
    const typename L::V u = L::add(T::mul(d, h.v[2]), g);          // u = d.mul_(beta2).add_(g)
    s[2] = T::addcmul(T::mul(s[2], h.v[4]), u, u, h.v[5]);          // n.mul_(beta3).addcmul_(u, u, value=1 - beta3)
    s[3] = g;                                                       // prev.copy_(g)
  }
  template <class L, bool F>
  static typename L::V param(typename L::V p, typename L::V, const typename L::V* s, typename L::V root,
                             typename L::V, const H& h) {
    using T = Torch<L, F>;
    const typename L::V den = T::add(T::div(root, h.v[7]), h.v[8]);  // n.sqrt().div_(c3).add_(eps)
    typename L::V x = T::mul(p, h.v[9]);                             // p.mul_(1 - lr*wd)
    x = T::addcdiv(x, s[0], den, h.v[10]);                           // p.addcdiv_(m, den, value=-lr / c1)
    x = T::addcdiv(x, s[1], den, h.v[11]);                           // p.addcdiv_(e, den, value=-lr*beta2 / c2)
    return T::div(x, h.v[12]);                                       // p.div_(1 + lr*wd)
  }
};

// ---- the shared machinery ---------------------------------------------------------------------
// whether state k of rule R is kept in fp32 (a compile-time constant in the unrolled loops over k)
template <class R>
constexpr bool kept(int k) { return ((R::kKept >> k) & 1u) != 0; }

// one entry per state of the rule (the caller's arrays): a coded state's codes and absmax, a kept
// state's floats (as `codes`, cast back by the template; its absmax unused)
struct Tensor {
  void* p;
  const void* g;
  uint8_t* const* codes;
  float* const* absmax;
  int64_t n;
};

struct Call {
  const CodeTable* table;  // one per state (a kept state's unused)
#if ADAM8_AVX512
  const BytePlanes* const* planes;  // each map as byte planes (codes8.h), for the VBMI decode (kept: null)
#endif
  int64_t blocksize;
  H h;
  Sqrt sqrt_of;    // torch's sqrt (inline root where cpu.py found one that matches)
  Sqrt sqrt_call;  // the same without the inline root: for a tile with a negative input
  int simd;
};

template <int N>
struct Buffers {
  alignas(64) float s[N][kMaxBlocksize];
  alignas(64) float aux[kMaxBlocksize];
  alignas(64) float root[kMaxBlocksize];
  alignas(64) int32_t reset[kMaxBlocksize];
};

// pass A on lanes of width L::kWidth from element i of the tile (tile-relative pointers), the map
// values q[] of the old codes given
template <class R, class L, bool F, typename P, typename G>
inline void lanes_moments_of(const P* p, const G* g, const typename L::V* q, const float* old, int64_t i,
                             const Call& c, Buffers<R::kStates>& b) {
  using V = typename L::V;
  V s[R::kStates];
  for (int k = 0; k < R::kStates; ++k) s[k] = kept<R>(k) ? q[k] : L::mul(q[k], L::set(old[k]));
  V aux = L::set(0.0f);
  R::template moments<L, F>(L::load(g + i), L::load(p + i), s, aux, c.h);
  typename L::M bad = L::non_finite(s[0]);
  for (int k = 1; k < R::kStates; ++k) bad = L::either(bad, L::non_finite(s[k]));
  for (int k = 0; k < R::kStates; ++k) L::storef(b.s[k] + i, L::zero_where(bad, s[k]));
  L::storef(b.aux + i, aux);
  L::store_mask(b.reset + i, bad);
}

// pass A on lanes from element i, decoding the old codes with the lanes' gather (or a load)
template <class R, class L, bool F, typename P, typename G>
inline void lanes_moments(const P* p, const G* g, uint8_t* const* codes, const float* old, int64_t i, const Call& c,
                          Buffers<R::kStates>& b) {
  typename L::V q[R::kStates];
  for (int k = 0; k < R::kStates; ++k)
    q[k] = kept<R>(k) ? L::loadf(reinterpret_cast<const float*>(codes[k]) + i) : L::decode(c.table[k], codes[k] + i);
  lanes_moments_of<R, L, F>(p, g, q, old, i, c, b);
}

#if ADAM8_AVX512 && defined(__AVX512VBMI__)
// pass A on 64 elements from i: the codes decoded with byte shuffles instead of gathers (codes8.h's
// dequantize64: the same map values), then the 16-lane steps
template <class R, bool F, typename P, typename G>
inline void moments64(const P* p, const G* g, uint8_t* const* codes, const float* old, int64_t i, const Call& c,
                      Buffers<R::kStates>& b, __m512i order) {
  __m512 q[R::kStates][4];
  for (int k = 0; k < R::kStates; ++k) {
    if (kept<R>(k)) {
      for (int j = 0; j < 4; ++j) q[k][j] = _mm512_loadu_ps(reinterpret_cast<const float*>(codes[k]) + i + 16 * j);
    } else {
      dequantize64(*c.planes[k], codes[k] + i, order, q[k]);
    }
  }
  for (int j = 0; j < 4; ++j) {
    __m512 qj[R::kStates];
    for (int k = 0; k < R::kStates; ++k) qj[k] = q[k][j];
    lanes_moments_of<R, Lane16, F>(p, g, qj, old, i + 16 * j, c, b);
  }
}
#endif

// pass C's parameter update on lanes from element i of the tile
template <class R, class L, bool F, typename P, typename G>
inline void lanes_param(P* p, const G* g, int64_t i, const Call& c, const Buffers<R::kStates>& b) {
  using V = typename L::V;
  V s[R::kStates];
  for (int k = 0; k < R::kStates; ++k) s[k] = L::loadf(b.s[k] + i);
  const V root = R::kRoot >= 0 ? L::loadf(b.root + i) : L::set(0.0f);
  const V old = L::load(p + i);
  const V updated = R::template param<L, F>(old, L::load(g + i), s, root, L::loadf(b.aux + i), c.h);
  L::store(p + i, L::select(L::load_mask(b.reset + i), old, updated));
}

// one element loop [lo, hi) of the tile with the widest lanes the call allows, scalar for the rest
// (blocks are whole multiples of 16 elements: only a tensor's last block has a scalar tail)
template <typename Fn1, typename Fn8, typename Fn16>
inline void over(int64_t lo, int64_t hi, int simd, Fn1 one, Fn8 eight, Fn16 sixteen) {
  int64_t i = lo;
#if ADAM8_AVX512
  if (simd >= kAvx512)
    for (; i + 16 <= hi; i += 16) sixteen(i);
#endif
#if ADAM8_AVX2
  if (simd >= kAvx2)
    for (; i + 8 <= hi; i += 8) eight(i);
#endif
  (void)simd, (void)eight, (void)sixteen;
  for (; i < hi; ++i) one(i);
}

// the new absmax of the values x[lo, hi) (max |x|: every x finite after the non-finite rule)
inline float block_absmax(const float* x, int64_t lo, int64_t hi, int simd) {
  uint32_t best = 0;
  int64_t i = lo;
#if ADAM8_AVX512
  if (simd >= kAvx512) {
    __m512i acc = _mm512_setzero_si512();
    for (; i + 16 <= hi; i += 16)
      acc = _mm512_max_epu32(acc, _mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + i)), _mm512_set1_epi32(0x7fffffff)));
    best = _mm512_reduce_max_epu32(acc);
  }
#endif
#if ADAM8_AVX2
  if (simd >= kAvx2) {
    __m256i acc = _mm256_setzero_si256();
    for (; i + 8 <= hi; i += 8)
      acc = _mm256_max_epu32(acc, _mm256_and_si256(_mm256_castps_si256(_mm256_loadu_ps(x + i)), _mm256_set1_epi32(0x7fffffff)));
    alignas(32) uint32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    for (uint32_t lane : lanes) best = std::max(best, lane);
  }
#endif
  for (; i < hi; ++i) best = std::max(best, bits_of(x[i]) & 0x7fffffffu);
  return float_of(best);
}

// whether some x[i] < 0 for i in [0, n) (-0 and NaN are not: x < 0.0f, as the scalar test); vectorized,
// since a scalar scan of every tile cost about a fifth of RMSprop's and Adagrad's step
inline bool any_negative(const float* x, int64_t n, int simd) {
  int64_t i = 0;
#if ADAM8_AVX512
  if (simd >= kAvx512) {
    __mmask16 any = 0;
    for (; i + 16 <= n; i += 16) any |= _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), _mm512_setzero_ps(), _CMP_LT_OQ);
    if (any) return true;
  }
#endif
#if ADAM8_AVX2
  if (simd >= kAvx2) {
    __m256 any = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_setzero_ps(), _CMP_LT_OQ));
    if (_mm256_movemask_ps(any) != 0) return true;
  }
#endif
  (void)simd;
  bool negative = false;
  for (; i < n; ++i) negative |= x[i] < 0.0f;
  return negative;
}

template <class R, bool F, typename P, typename G>
void rule_tile(const Tensor& t, const Call& c, int64_t start, int64_t len, Buffers<R::kStates>& b) {
  P* p = static_cast<P*>(t.p) + start;
  const G* g = static_cast<const G*>(t.g) + start;
  uint8_t* codes[R::kStates];  // (a kept state's: its floats, from the tile's start)
  for (int k = 0; k < R::kStates; ++k)
    codes[k] = kept<R>(k) ? reinterpret_cast<uint8_t*>(reinterpret_cast<float*>(t.codes[k]) + start)
                          : t.codes[k] + start;
  const int64_t bs = c.blocksize, first_block = start / bs;
  const int simd = c.simd;
  // A: decode, moments, the non-finite rule
#if ADAM8_AVX512 && defined(__AVX512VBMI__)
  const __m512i order = interleave_order();
#endif
  const int64_t room = t.n - start;  // elements from the tile's start to the tensor's end
  for (int64_t lo = 0; lo < len; lo += bs) {
    int64_t from = lo;
    const int64_t hi = std::min(len, lo + bs);
    // Ask for this block's elements two tiles on (kAhead) of g, p and each state's codes, into L2 (a hint:
    // nothing changes but when the memory arrives): one core keeps more requests in flight than the
    // hardware prefetcher alone gets it to (as adam8bit.h's moments64). Measured at 16.7M elements, 1 thread,
    // AMD EPYC: Lion8bit's and AdEMAMix8bit's kernels ~25-35 % faster, RMSprop8bit's ~10 %. (Written out here:
    // as a function taking `codes`, the array escaped and every loop of the tile got slower.)
    if (hi + kAhead <= room) {
      const char* gb = reinterpret_cast<const char*>(g + lo + kAhead);
      for (int64_t at = 0; at < (hi - lo) * static_cast<int64_t>(sizeof(G)); at += 64) __builtin_prefetch(gb + at, 0, 2);
      const char* pb = reinterpret_cast<const char*>(p + lo + kAhead);
      for (int64_t at = 0; at < (hi - lo) * static_cast<int64_t>(sizeof(P)); at += 64) __builtin_prefetch(pb + at, 0, 2);
      for (int k = 0; k < R::kStates; ++k) {
        const int64_t size = kept<R>(k) ? 4 : 1;  // bytes per element
        for (int64_t at = 0; at < (hi - lo) * size; at += 64) __builtin_prefetch(codes[k] + (lo + kAhead) * size + at, 0, 2);
      }
    }
    float old[R::kStates];
    for (int k = 0; k < R::kStates; ++k) old[k] = kept<R>(k) ? 1.0f : t.absmax[k][first_block + lo / bs];
#if ADAM8_AVX512 && defined(__AVX512VBMI__)
    if (simd >= kAvx512)
      for (; from + 64 <= hi; from += 64) moments64<R, F>(p, g, codes, old, from, c, b, order);
#endif
    over(from, hi, simd,
        [&](int64_t i) { lanes_moments<R, Lane1, F>(p, g, codes, old, i, c, b); },
#if ADAM8_AVX2
        [&](int64_t i) { lanes_moments<R, Lane8, F>(p, g, codes, old, i, c, b); },
#else
        [](int64_t) {},
#endif
#if ADAM8_AVX512
        [&](int64_t i) { lanes_moments<R, Lane16, F>(p, g, codes, old, i, c, b); });
#else
        [](int64_t) {});
#endif
  }
  // B: torch's square root of the state the update divides by
  if constexpr (R::kRoot >= 0) {
    const float* x = b.s[R::kRoot];
    // the inline roots are MKL's only for x >= 0 (or -0)
    const bool negative = c.sqrt_of.root != kRootCall && any_negative(x, len, simd);
    (negative ? c.sqrt_call : c.sqrt_of)(x, b.root, len);
  }
  // C: each block: the parameter, then each state's absmax and codes
  for (int64_t lo = 0; lo < len; lo += bs) {
    const int64_t hi = std::min(len, lo + bs);
    over(lo, hi, simd,
        [&](int64_t i) { lanes_param<R, Lane1, F>(p, g, i, c, b); },
#if ADAM8_AVX2
        [&](int64_t i) { lanes_param<R, Lane8, F>(p, g, i, c, b); },
#else
        [](int64_t) {},
#endif
#if ADAM8_AVX512
        [&](int64_t i) { lanes_param<R, Lane16, F>(p, g, i, c, b); });
#else
        [](int64_t) {});
#endif
    for (int k = 0; k < R::kStates; ++k) {
      const float* x = b.s[k];
      if (kept<R>(k)) {  // kept in fp32: the new values as they are
        std::memcpy(reinterpret_cast<float*>(codes[k]) + lo, x + lo, static_cast<size_t>(hi - lo) * sizeof(float));
        continue;
      }
      const float absmax = block_absmax(x, lo, hi, simd);
      t.absmax[k][first_block + lo / bs] = absmax;
      const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
      const CodeTable table = c.table[k];
      uint8_t* out = codes[k];
      over(lo, hi, simd,
          [&](int64_t i) { Lane1::encode(table, out + i, x[i] * inv); },
#if ADAM8_AVX2
          [&](int64_t i) { Lane8::encode(table, out + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(inv))); },
#else
          [](int64_t) {},
#endif
#if ADAM8_AVX512
          [&](int64_t i) { Lane16::encode(table, out + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_set1_ps(inv))); });
#else
          [](int64_t) {});
#endif
    }
  }
}

template <class R, bool F, typename P, typename G>
void run(const Tensor& t, const Call& c, int team) {
  const int64_t tile = std::max<int64_t>(1, kTile / c.blocksize) * c.blocksize;
  const int64_t tiles = (t.n + tile - 1) / tile;
#pragma omp parallel num_threads(team)
  {
    auto* b = new Buffers<R::kStates>;
#pragma omp for schedule(dynamic, 1)
    for (int64_t k = 0; k < tiles; ++k) rule_tile<R, F, P, G>(t, c, k * tile, std::min(tile, t.n - k * tile), *b);
    delete b;
  }
}

using RunFn = void (*)(const Tensor&, const Call&, int);

template <class R, bool F>
RunFn run_for_dtypes(int p_dtype, int g_dtype) {
  const bool same = g_dtype == p_dtype;
  if (!same && g_dtype != kFloat32) return nullptr;
  switch (p_dtype) {
    case kFloat32: return run<R, F, float, float>;
    case kBFloat16: return same ? run<R, F, BF16, BF16> : run<R, F, BF16, float>;
    case kFloat16: return same ? run<R, F, _Float16, _Float16> : run<R, F, _Float16, float>;
    default: return nullptr;
  }
}

template <class R>
RunFn run_for(int p_dtype, int g_dtype, bool fused) {
  return fused ? run_for_dtypes<R, true>(p_dtype, g_dtype) : run_for_dtypes<R, false>(p_dtype, g_dtype);
}

// rule ids shared with cpu_rules.py
enum : int { kLion = 1, kAdEMAMix = 2, kRMSprop = 3, kAdagrad = 4, kAdan = 5 };

inline int states_of(int rule) {
  switch (rule) {
    case kLion: return Lion::kStates;
    case kAdEMAMix: return AdEMAMix::kStates;
    case kRMSprop: return RMSprop::kStates;
    case kAdagrad: return Adagrad::kStates;
    case kAdan: return Adan::kStates;
    default: return -1;
  }
}

// the bit mask of the states rule keeps in fp32 (0: every state coded)
inline unsigned kept_of(int rule) {
  switch (rule) {
    case kAdan: return Adan::kKept;
    default: return 0;
  }
}

inline RunFn runner(int rule, int p_dtype, int g_dtype, bool fused) {
  switch (rule) {
    case kLion: return run_for<Lion>(p_dtype, g_dtype, fused);
    case kAdEMAMix: return run_for<AdEMAMix>(p_dtype, g_dtype, fused);
    case kRMSprop: return run_for<RMSprop>(p_dtype, g_dtype, fused);
    case kAdagrad: return run_for<Adagrad>(p_dtype, g_dtype, fused);
    case kAdan: return run_for<Adan>(p_dtype, g_dtype, fused);
    default: return nullptr;
  }
}

}  // namespace rules
}  // namespace
