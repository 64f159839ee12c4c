#pragma once

// Byte codes into a 256-entry map: the exact nearest-code table (CodeTable, built by
// adam8lib/kernels/code_table.py) and, with AVX-512 VBMI, dequantizing 64 codes without a gather
// (BytePlanes). Shared by every step whose states are one byte per element (8-bit maps, FP8).

#include "simd.h"

namespace {

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


// The loops of the rule template (rules.h) read the table with plain loads, one per element, instead
// of a gather instruction: the same entries, so the same codes. A gather is slow on some CPUs (on the
// AMD EPYC of bench/README.md a 16-lane vpgatherdd took ~11 ns from L1, 16 loads ~6 ns; on Intel CPUs
// with the GDS/Downfall microcode fix gathers are slow too). (Adam8bit's loops still gather.)
template <int W>
inline void table_entries(const CodeTable& t, const uint32_t* bucket, int32_t* entry) {
  for (int j = 0; j < W; ++j) entry[j] = t.steps[bucket[j]];
}

#if ADAM8_AVX2
// the code from a table entry: bits 0-7, or bits 8-15 where (bits << 16) > entry (unsigned)
inline __m256i code_of_entry8(__m256i bits, __m256i entry) {
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);  // AVX2 compares signed: flip both signs
  const __m256i above = _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_slli_epi32(bits, 16), flip),
                                           _mm256_xor_si256(entry, flip));
  return _mm256_and_si256(_mm256_srlv_epi32(entry, _mm256_and_si256(above, _mm256_set1_epi32(8))),
                          _mm256_set1_epi32(0xff));
}

// nearest_code8 with the table read by loads (see table_entries)
inline __m256i nearest_code8_loads(__m256 x, const CodeTable& t) {
  const __m256i bits = _mm256_castps_si256(x);
  alignas(32) uint32_t bucket[8];
  alignas(32) int32_t entry[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(bucket), _mm256_srli_epi32(bits, 16));
  table_entries<8>(t, bucket, entry);
  return code_of_entry8(bits, _mm256_load_si256(reinterpret_cast<const __m256i*>(entry)));
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
#endif

#if ADAM8_AVX512
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

// nearest_code16 with the table read by loads (see table_entries)
inline __m512i nearest_code16_loads(__m512 x, const CodeTable& t) {
  const __m512i bits = _mm512_castps_si512(x);
  alignas(64) uint32_t bucket[16];
  alignas(64) int32_t entry_of[16];
  _mm512_store_si512(bucket, _mm512_srli_epi32(bits, 16));
  table_entries<16>(t, bucket, entry_of);
  const __m512i entry = _mm512_load_si512(entry_of);
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

}  // namespace
