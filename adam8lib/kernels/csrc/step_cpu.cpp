// The CPU steps' C entry points (adam8lib/kernels/cpu*.py call them through ctypes): one shared
// library, one translation unit (so the compiler inlines across the pieces), built from
//   simd.h      SIMD levels, element types, loads/stores, torch's square root, the reset mark
//   codes8.h    byte codes: nearest-code tables, byte-plane dequantizing
//   adam8bit.h  the 8-bit Adam step (also the FP8 format's): tiles, pipelined loops, threads
//   adam4bit.h  the 4-bit formats' Adam step (two codes per byte, rank-1 scales)
//   rules.h     the rule template: the elementwise rules of the optimizer family (Lion, AdEMAMix, ...)
//               on the same byte-code machinery

#include "adam8bit.h"
#include "adam4bit.h"
#include "rules.h"


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

// The rule template's scan of a tile for a negative state (rules.h any_negative: x < 0, so not -0 or NaN)
// with the loops of SIMD level `simd` (clamped to this build's): 1 if some x[i] < 0, else 0. For the tests:
// on CPUs whose inline root already gives MKL's NaN for a negative x the step cannot show a wrong scan.
extern "C" int rule_any_negative(const float* x, int64_t n, int simd) {
  return rules::any_negative(x, n, std::clamp(simd, 0, kBestSimd)) ? 1 : 0;
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

// One step of a 4-bit format, exact (bit-identical to the reference step of its format), in place.
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

// One step of an elementwise rule of the family (rules.h: 1 Lion, 2 AdEMAMix, 3 RMSprop, 4 Adagrad, 5 Adan)
// on byte-coded blockwise states, in place, bit for bit with QuantizedStateOptimizer's reference
// step. codes/absmax/qmaps/steps/nan_codes: one entry per state of the rule, in its order (each
// state its own map and nearest-code table; a state the rule keeps in fp32: its floats as `codes`,
// the other entries unused); hyper: the rule's fp32 scalars (n_hyper of them, at
// most 16, rules.h says which); the other arguments as adam8bit_step_cpu's. Returns 0, or -1 for
// an unknown rule, a wrong number of states or scalars, an unsupported dtype or blocksize.
extern "C" int rule_step_cpu(int rule, void* p, const void* g, int p_dtype, int g_dtype, int64_t n, int64_t blocksize,
                             int n_states, uint8_t* const* codes, float* const* absmax, const float* const* qmaps,
                             const int32_t* const* steps, const int* nan_codes, const float* hyper, int n_hyper,
                             int fused, void* mkl_sqrt, int64_t mkl_sqrt_mode, int mkl_sqrt_inline, int simd,
                             int threads) {
  if (blocksize <= 0 || blocksize > kMaxBlocksize || n < 0) return -1;
  if (rules::states_of(rule) != n_states || n_hyper < 0 || n_hyper > 16) return -1;
  const rules::RunFn run = rules::runner(rule, p_dtype, g_dtype, fused != 0);
  if (run == nullptr) return -1;
  if (n == 0) return 0;
  const unsigned kept = rules::kept_of(rule);
  rules::Tensor t{p, g, codes, absmax, n};
  rules::Call c{};
  std::vector<CodeTable> tables(static_cast<size_t>(n_states), CodeTable{nullptr, nullptr, 0});
#if ADAM8_AVX512
  std::vector<BytePlanes> planes;
  planes.reserve(static_cast<size_t>(n_states));
  std::vector<const BytePlanes*> plane_of(static_cast<size_t>(n_states), nullptr);
#endif
  for (int k = 0; k < n_states; ++k) {
    if ((kept >> k) & 1u) continue;  // kept in fp32: no map
    tables[k] = CodeTable{qmaps[k], steps[k], nan_codes[k]};
#if ADAM8_AVX512
    planes.emplace_back(qmaps[k]);
    plane_of[k] = &planes.back();
#endif
  }
  c.table = tables.data();
#if ADAM8_AVX512
  c.planes = plane_of.data();
#endif
  for (int k = 0; k < n_hyper; ++k) c.h.v[k] = hyper[k];
  c.blocksize = blocksize;
  c.simd = std::clamp(simd, 0, kBestSimd);
  const auto vms = reinterpret_cast<Sqrt::VmsSqrt>(mkl_sqrt);
  c.sqrt_of = Sqrt{vms, mkl_sqrt_mode, root_for_call(mkl_sqrt, mkl_sqrt_inline, simd)};
  c.sqrt_call = Sqrt{vms, mkl_sqrt_mode, kRootCall};
  const int team = n < (int64_t{1} << 15) ? 1 : std::max(1, threads);
  run(t, c, team);
  return 0;
}
