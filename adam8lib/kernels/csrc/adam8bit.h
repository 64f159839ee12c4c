#pragma once

// The 8-bit Adam step on the CPU: OpenMP threads over runs of blocks, AVX2/AVX-512 inside a block.
// (It is also the FP8 format's step, given FP8's code values and tables; the 4-bit formats' step,
// adam4bit.h, is built on the same pieces.)
//
// Plain C++ (no torch headers, so it builds in seconds). adam8lib/kernels/cpu.py builds it
// with -O3 -march=native -fopenmp -ffp-contract=off, checks every argument, and calls
// adam8bit_step_cpu (step_cpu.cpp) through ctypes with the tensors' data pointers.
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

#include "codes8.h"

namespace {

// fp32 hyperparameters, rounded from Python's floats by cpu.py (as torch rounds its scalars)
struct Hyper {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;          // 1 - lr * weight_decay (exactly 1 without weight decay: p * 1 == p)
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;
  float neg_step_size;  // -lr / (1 - beta1^t)
  float inv_bc2_sqrt;   // 1 / sqrt(1 - beta2^t), used by the fast mode only
};

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
#endif

#if ADAM8_AVX512
// ---- the same steps, 16 elements at a time (AVX-512) ------------------------------------
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
