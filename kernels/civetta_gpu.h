// civetta_gpu.h: the one portability header every kernel in kernels/ includes.
//
// The kernels are written in the HIP/CUDA dialect but compile without ROCm or CUDA
// headers: AMD with `clang -x hip --offload-device-only -nogpuinc -nogpulib`,
// NVIDIA with `clang -x cuda --cuda-device-only -nocudainc -nocudalib`.
// Everything target specific (ids, barriers, cross-lane ops, fast math, the
// 16x16x16 matrix step) lives here, so kernel files contain no #ifdefs except
// the build-time CIVETTA_SCHED_BARRIER switch.
#pragma once

#if defined(__AMDGCN__)
#define CV_AMD 1
#elif defined(__CUDA_ARCH__) || defined(__NVPTX__)
#define CV_NVIDIA 1
#else
#error "civetta_gpu.h: compile device code for AMDGPU (-x hip) or NVPTX (-x cuda)"
#endif

// ---- function and variable qualifiers (normally from the runtime headers) ----
#ifndef __global__
#define __global__ __attribute__((global))
#endif
#ifndef __device__
#define __device__ __attribute__((device))
#endif
#ifndef __shared__
#define __shared__ __attribute__((shared))
#endif

// Kernels use C linkage so the symbol names are stable for hipModuleGetFunction.
#define CV_KERNEL extern "C" __global__
#define CV_DEVICE __device__ static inline __attribute__((always_inline))
// Full unrolling of fixed-trip loops over per-thread arrays keeps them in registers
// (clang-19 otherwise left attention's score array in scratch).
#define CV_UNROLL _Pragma("unroll")
#if CV_AMD
#define CV_LAUNCH_BOUNDS(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#else
#define CV_LAUNCH_BOUNDS(threads) __attribute__((launch_bounds(threads)))
#endif

// ---- fixed-width types without <stdint.h> ----
typedef signed char cv_i8;
typedef unsigned char cv_u8;
typedef short cv_i16;
typedef unsigned short cv_u16;
typedef int cv_i32;
typedef unsigned int cv_u32;
typedef _Float16 cv_half;

typedef int cv_v4i __attribute__((ext_vector_type(4)));
typedef int cv_v8i __attribute__((ext_vector_type(8)));
typedef float cv_v8f __attribute__((ext_vector_type(8)));
typedef _Float16 cv_v16h __attribute__((ext_vector_type(16)));

// ---- ids, barriers, wave size ----
#if CV_AMD
#define CV_WAVE 32 /* gfx10+ kernels are compiled wave32 (the WMMA builtins need it) */
CV_DEVICE unsigned cv_tid_x() { return __builtin_amdgcn_workitem_id_x(); }
CV_DEVICE unsigned cv_tid_y() { return __builtin_amdgcn_workitem_id_y(); }
CV_DEVICE unsigned cv_bid_x() { return __builtin_amdgcn_workgroup_id_x(); }
CV_DEVICE unsigned cv_bid_y() { return __builtin_amdgcn_workgroup_id_y(); }
CV_DEVICE unsigned cv_bid_z() { return __builtin_amdgcn_workgroup_id_z(); }
CV_DEVICE unsigned cv_lane() { return __builtin_amdgcn_mbcnt_lo(~0u, 0u); }
CV_DEVICE void cv_sync() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
// Stops the machine scheduler from moving instructions across this point.
#define CV_SCHED_BARRIER() __builtin_amdgcn_sched_barrier(0)
#else
#define CV_WAVE 32
CV_DEVICE unsigned cv_tid_x() { return __nvvm_read_ptx_sreg_tid_x(); }
CV_DEVICE unsigned cv_tid_y() { return __nvvm_read_ptx_sreg_tid_y(); }
CV_DEVICE unsigned cv_bid_x() { return __nvvm_read_ptx_sreg_ctaid_x(); }
CV_DEVICE unsigned cv_bid_y() { return __nvvm_read_ptx_sreg_ctaid_y(); }
CV_DEVICE unsigned cv_bid_z() { return __nvvm_read_ptx_sreg_ctaid_z(); }
CV_DEVICE unsigned cv_lane() { return __nvvm_read_ptx_sreg_laneid(); }
CV_DEVICE void cv_sync() { __syncthreads(); }
#define CV_SCHED_BARRIER() ((void)0)
#endif

// ---- cross-lane reductions within one wave ----
CV_DEVICE float cv_shfl_xor(float v, unsigned mask) {
#if CV_AMD
  int src = (int)((cv_lane() ^ mask) & (CV_WAVE - 1)) << 2;
  return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, v)));
#else
  return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, (int)mask, 0x1f);
#endif
}
CV_DEVICE float cv_wave_sum(float v) {
  for (unsigned m = CV_WAVE / 2; m > 0; m >>= 1) v += cv_shfl_xor(v, m);
  return v;
}
CV_DEVICE float cv_wave_max(float v) {
  for (unsigned m = CV_WAVE / 2; m > 0; m >>= 1) v = __builtin_fmaxf(v, cv_shfl_xor(v, m));
  return v;
}
// One q8_1 block per wave (CV_WAVE == 32): lane l's value v becomes q[l] = rint(v * 127 / amax)
// and lane 0 writes ds = (d, d * sum q) with d = amax / 127 (s sums the quantised values, not x:
// Q4_K's min term then uses the same input as its scale term). The arithmetic of every q8_1
// producer (civetta_quantize_q8_1, civetta_rmsnorm_q8_1, the decode attention's output), so
// their blocks are bit for bit the same for the same v.
CV_DEVICE void cv_quantize_q8_1_block(float v, cv_i8* q, float* ds) {
  const float amax = cv_wave_max(__builtin_fabsf(v));
  const float qv = __builtin_rintf(v * (amax > 0.0f ? 127.0f / amax : 0.0f));
  const float sum = cv_wave_sum(qv);
  q[cv_lane()] = (cv_i8)qv;
  if (cv_lane() == 0) {
    ds[0] = amax / 127.0f;
    ds[1] = amax / 127.0f * sum;
  }
}
// Sum over groups of `width` adjacent lanes (width a power of two <= CV_WAVE).
// Keeps a uniform int in a vector register on AMD (a no-op elsewhere). For offsets that would
// otherwise be hoisted into scalar registers many at a time: the 16-row mat-vecs' per-row
// activation addresses overflowed the SGPR budget (SGPR spills with clang-19 and clang-22).
CV_DEVICE int cv_in_vgpr(int v) {
#if CV_AMD
  asm volatile("" : "+v"(v));
#endif
  return v;
}

// ---- starting a kernel while the one before it finishes (issue #17) ----
// On sm_90 and later the CUDA backend launches a kernel whose PTX contains cv_wait_prior_kernels()
// with programmatic stream serialization (src/backend/gpu/cuda.rs `launch`, `engine.gpu.overlap_launches`):
// its workgroups may start as soon as every workgroup of the previous kernel has called
// cv_start_next_kernel() (or exited), so its launch and its first weight loads hide behind that
// kernel's tail. Rules for such a kernel:
//   - before cv_wait_prior_kernels() it reads only what no kernel writes (weights) and writes nothing;
//   - every workgroup calls cv_wait_prior_kernels() before any early return (a kernel that returned
//     without waiting could finish before its predecessor, and a third kernel waiting on it would
//     then read unfinished results);
//   - cv_start_next_kernel() after the wait, so at most two kernels overlap.
// Elsewhere (AMD, older NVIDIA targets) both are no-ops and the stream order is the plain one;
// cv_kernels_overlap says which, for code that only pays off when kernels overlap.
#if CV_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CV_GRID_DEPENDENCIES 1
#else
#define CV_GRID_DEPENDENCIES 0
#endif
constexpr bool cv_kernels_overlap = CV_GRID_DEPENDENCIES;
CV_DEVICE void cv_wait_prior_kernels() {
#if CV_GRID_DEPENDENCIES
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
CV_DEVICE void cv_start_next_kernel() {
#if CV_GRID_DEPENDENCIES
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Both, at the top of a kernel with nothing to do before the wait.
CV_DEVICE void cv_follow_prior_kernels() {
  cv_wait_prior_kernels();
  cv_start_next_kernel();
}

CV_DEVICE float cv_group_sum(float v, unsigned width) {
  for (unsigned m = width / 2; m > 0; m >>= 1) v += cv_shfl_xor(v, m);
  return v;
}
CV_DEVICE float cv_group_max(float v, unsigned width) {
  for (unsigned m = width / 2; m > 0; m >>= 1) v = __builtin_fmaxf(v, cv_shfl_xor(v, m));
  return v;
}

// ---- 4-way int8 dot product: acc + sum of a.byte[i] * b.byte[i], all signed ----
CV_DEVICE int cv_dot4_i8(int a, int b, int acc) {
#if CV_AMD
  return __builtin_amdgcn_sudot4(true, a, true, b, acc, false); // v_dot4_i32_iu8 (gfx11)
#else
  int r; // clang has no builtin for dp4a
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
  return r;
#endif
}

// ---- fast math ----
CV_DEVICE float cv_exp2(float x) {
#if CV_AMD
  return __builtin_exp2f(x);
#else
  return __nvvm_ex2_approx_f(x);
#endif
}
CV_DEVICE float cv_log2(float x) {
#if CV_AMD
  return __builtin_log2f(x);
#else
  return __nvvm_lg2_approx_f(x);
#endif
}
CV_DEVICE float cv_exp(float x) { return cv_exp2(x * 1.4426950408889634f); }
CV_DEVICE float cv_rsqrt(float x) {
#if CV_AMD
  return __builtin_amdgcn_rsqf(x);
#else
  return __nvvm_rsqrt_approx_f(x);
#endif
}
CV_DEVICE float cv_rcp(float x) {
#if CV_AMD
  return __builtin_amdgcn_rcpf(x);
#else
  return __nvvm_rcp_approx_ftz_f(x);
#endif
}
// a * b rounded to f32 and never fused with a following add into an FMA (where a result has to
// match the CPU's separate multiply and add: the MoE weighted sum). CUDA's clang ignores
// `#pragma clang fp contract`, so NVIDIA gets the round-to-nearest multiply intrinsic.
CV_DEVICE float cv_mul_nofma(float a, float b) {
#if CV_AMD
#pragma clang fp contract(off)
  return a * b;
#else
  return __nvvm_mul_rn_f(a, b);
#endif
}
// gpt-oss's gated activation as ggml's CPU swiglu_oai (src/backend: swiglu_oai_host): x = min(gate,
// 7), y = clamp(up, -7, 7), x / (1 + e^(-1.702 x)) * (y + 1). Shared by civetta_swiglu_oai and the
// quantiser that feeds the routed down projection (civetta_quantize_q8_1).
CV_DEVICE float cv_swiglu_oai(float gate, float up) {
  const float x = __builtin_fminf(gate, 7.0f);
  const float y = __builtin_fminf(__builtin_fmaxf(up, -7.0f), 7.0f);
  return x / (1.0f + cv_exp(-1.702f * x)) * (y + 1.0f);
}
// sin and cos of an angle in radians, with the range reduction done here.
CV_DEVICE void cv_sincos(float theta, float* s, float* c) {
  float rev = theta * 0.15915494309189535f;
  rev -= __builtin_floorf(rev);
#if CV_AMD
  *s = __builtin_amdgcn_sinf(rev); // hardware sin/cos take revolutions
  *c = __builtin_amdgcn_cosf(rev);
#else
  *s = __nvvm_sin_approx_f(rev * 6.283185307179586f);
  *c = __nvvm_cos_approx_f(rev * 6.283185307179586f);
#endif
}

// ---- 16x16x16 matrix step on one wave ----
// Convention for both element types: A is a 16x16 tile stored row-major with K
// contiguous (`ld` elements between rows), B is stored as 16 rows of N with K
// contiguous (an "NT" GEMM, like weights [n][k]); C[r][c] += sum_k A[r][k]*B[c][k].
// Accumulator layout: on gfx11 WMMA (and the scalar fallback) lane l holds element i
// (0..7) at row 2*i + l/16, column l%16; on NVIDIA mma.sync see below. Kernels only
// use cv_acc_row(i) / cv_acc_col(i).
#if CV_AMD && (defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || \
               defined(__gfx1103__) || defined(__gfx1150__) || defined(__gfx1151__) || \
               defined(__gfx1152__) || defined(__gfx1153__))
#define CV_HAS_WMMA 1
typedef cv_v4i cv_frag_i8;  // 16 int8 of this lane's row (A) or column (B)
typedef cv_v16h cv_frag_f16; // 16 halves likewise
CV_DEVICE cv_frag_i8 cv_load_frag_i8(const cv_i8* tile, int ld) {
  return *(const cv_v4i*)(tile + (cv_lane() & 15) * ld);
}
CV_DEVICE cv_frag_f16 cv_load_frag_f16(const cv_half* tile, int ld) {
  return *(const cv_v16h*)(tile + (cv_lane() & 15) * ld);
}
CV_DEVICE cv_v8i cv_mma_i8(cv_frag_i8 a, cv_frag_i8 b, cv_v8i c) {
  return __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(true, a, true, b, c, false);
}
CV_DEVICE cv_v8f cv_mma_f16(cv_frag_f16 a, cv_frag_f16 b, cv_v8f c) {
  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);
}
#elif CV_NVIDIA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
// NVIDIA sm_80+: each 16x16x16 step is two mma.sync m16n8k16 (columns 0-7 and 8-15).
// With g = lane/4 and t = lane%4, a fragment holds rows g and g+8 of the tile at
// K offset 4t (int8) or 2t and 2t+8 (f16): that is the A operand of mma.sync and, row
// for row, the B operands of both column halves ("NT" tiles are K-contiguous for both).
// Accumulator element i sits at row g + 8*((i&3)>>1), column 8*(i>>2) + 2t + (i&1).
#define CV_HAS_WMMA 0
#define CV_HAS_MMA_SYNC 1
struct cv_frag_i8 { int lo, hi; };          // rows g, g+8: 4 int8 each
struct cv_frag_f16 { unsigned r[4]; };       // rows g, g+8 at k 2t; rows g, g+8 at k 2t+8
CV_DEVICE cv_frag_i8 cv_load_frag_i8(const cv_i8* tile, int ld) {
  const unsigned lane = cv_lane(), g = lane >> 2, t = lane & 3;
  return cv_frag_i8{*(const int*)(tile + g * ld + 4 * t), *(const int*)(tile + (g + 8) * ld + 4 * t)};
}
CV_DEVICE cv_frag_f16 cv_load_frag_f16(const cv_half* tile, int ld) {
  const unsigned lane = cv_lane(), g = lane >> 2, t = lane & 3;
  const cv_half* r0 = tile + g * ld + 2 * t;
  const cv_half* r1 = tile + (g + 8) * ld + 2 * t;
  return cv_frag_f16{{*(const unsigned*)r0, *(const unsigned*)r1, *(const unsigned*)(r0 + 8), *(const unsigned*)(r1 + 8)}};
}
CV_DEVICE cv_v8i cv_mma_i8(cv_frag_i8 a, cv_frag_i8 b, cv_v8i c) {
  int c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7];
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(c0), "+r"(c1), "+r"(c2), "+r"(c3) : "r"(a.lo), "r"(a.hi), "r"(b.lo));
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
               : "+r"(c4), "+r"(c5), "+r"(c6), "+r"(c7) : "r"(a.lo), "r"(a.hi), "r"(b.hi));
  return (cv_v8i){c0, c1, c2, c3, c4, c5, c6, c7};
}
CV_DEVICE cv_v8f cv_mma_f16(cv_frag_f16 a, cv_frag_f16 b, cv_v8f c) {
  float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7];
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
               : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[0]), "r"(b.r[2]));
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c4), "+f"(c5), "+f"(c6), "+f"(c7)
               : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[1]), "r"(b.r[3]));
  return (cv_v8f){c0, c1, c2, c3, c4, c5, c6, c7};
}
#else
// Portable fallback: a fragment is a view of the tile in shared memory and
// every lane computes its 8 accumulator elements with scalar dot products.
#define CV_HAS_WMMA 0
// rows past `rows` repeat row rows-1; nib >= 0: the values are the 4-bit fields at bit nib of the bytes
struct cv_frag_i8 { const cv_i8* tile; int ld; int rows = 16; int nib = -1; };
struct cv_frag_f16 { const cv_half* tile; int ld; };
CV_DEVICE cv_frag_i8 cv_load_frag_i8(const cv_i8* tile, int ld) { return cv_frag_i8{tile, ld, 16, -1}; }
CV_DEVICE int cv_frag_value(const cv_frag_i8& f, const cv_i8* row, int k) {
  return f.nib < 0 ? (int)row[k] : ((int)(cv_u8)row[k] >> f.nib) & 15;
}
CV_DEVICE cv_frag_f16 cv_load_frag_f16(const cv_half* tile, int ld) { return cv_frag_f16{tile, ld}; }
CV_DEVICE cv_v8i cv_mma_i8(cv_frag_i8 a, cv_frag_i8 b, cv_v8i c) {
  const unsigned lane = cv_lane();
  const int bc = (int)(lane & 15);
  const cv_i8* bcol = b.tile + (bc < b.rows ? bc : b.rows - 1) * b.ld;
  for (int i = 0; i < 8; ++i) {
    const int ar = 2 * i + (int)(lane >> 4);
    const cv_i8* arow = a.tile + (ar < a.rows ? ar : a.rows - 1) * a.ld;
    int s = 0;
    for (int k = 0; k < 16; ++k) s += cv_frag_value(a, arow, k) * cv_frag_value(b, bcol, k);
    c[i] += s;
  }
  return c;
}
CV_DEVICE cv_v8f cv_mma_f16(cv_frag_f16 a, cv_frag_f16 b, cv_v8f c) {
  const unsigned lane = cv_lane();
  const cv_half* bcol = b.tile + (lane & 15) * b.ld;
  for (int i = 0; i < 8; ++i) {
    const cv_half* arow = a.tile + (2 * i + (int)(lane >> 4)) * a.ld;
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += (float)arow[k] * (float)bcol[k];
    c[i] += s;
  }
  return c;
}
#endif
// One 16x16x32 step: C += A[:, 0:16] * B[:, 0:16] + A[:, 16:32] * B[:, 16:32], with a_lo/b_lo the
// fragments at K offset 0 and a_hi/b_hi at offset 16 (cv_load_frag_i8 of the tile and of tile + 16).
// The integer sum is exact, so the result equals two cv_mma_i8 calls; NVIDIA issues one
// mma.sync m16n8k32 per column half instead of two m16n8k16 (half the matrix instructions).
#if defined(CV_HAS_MMA_SYNC)
CV_DEVICE cv_v8i cv_mma_i8_k32(cv_frag_i8 a_lo, cv_frag_i8 a_hi, cv_frag_i8 b_lo, cv_frag_i8 b_hi, cv_v8i c) {
  int c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7];
  // m16n8k32 operands: A {row g k 4t, row g+8 k 4t, row g k 16+4t, row g+8 k 16+4t}, B {k 4t, k 16+4t} of column g.
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+r"(c0), "+r"(c1), "+r"(c2), "+r"(c3)
               : "r"(a_lo.lo), "r"(a_lo.hi), "r"(a_hi.lo), "r"(a_hi.hi), "r"(b_lo.lo), "r"(b_hi.lo));
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+r"(c4), "+r"(c5), "+r"(c6), "+r"(c7)
               : "r"(a_lo.lo), "r"(a_lo.hi), "r"(a_hi.lo), "r"(a_hi.hi), "r"(b_lo.hi), "r"(b_hi.hi));
  return (cv_v8i){c0, c1, c2, c3, c4, c5, c6, c7};
}
#else
CV_DEVICE cv_v8i cv_mma_i8_k32(cv_frag_i8 a_lo, cv_frag_i8 a_hi, cv_frag_i8 b_lo, cv_frag_i8 b_hi, cv_v8i c) {
  return cv_mma_i8(a_hi, b_hi, cv_mma_i8(a_lo, b_lo, c));
}
#endif
// The fragments (K values 0-15 in *lo, 16-31 in *hi) of a 16-row x 32-K int8 tile read straight
// from global memory, for a cv_mma_i8_k32 whose both operands come from this function: rows
// past `rows` (1..16) repeat row rows-1, so a partial tile (the last weight rows, the activation
// rows of a short batch) reads only memory that exists; the caller drops those results. The K
// order inside the 32 values is this function's own (the same for both operands, and a dot
// product does not depend on it): on NVIDIA a lane reads 8 contiguous bytes of each of its two
// rows (4 lanes cover a row's 32-byte sector) instead of two 4-byte pieces 16 bytes apart.
// `tile` and `ld` must keep 8-byte (NVIDIA) / 16-byte (AMD) alignment.
// cv_frag_nibbles(f, 0 or 4): the fragment of the low or high 4 bits of each byte of f as values
// 0..15 (packed 4-bit weights: Q4_K's qs hold two sub-blocks, one per nibble).
#if defined(CV_HAS_MMA_SYNC)
typedef int cv_v2i __attribute__((ext_vector_type(2)));
CV_DEVICE void cv_load_frags_k32(const cv_i8* tile, long ld, int rows, cv_frag_i8* lo, cv_frag_i8* hi) {
  const int lane = (int)cv_lane(), g = lane >> 2, t = lane & 3;
  const int r0 = g < rows ? g : rows - 1, r1 = g + 8 < rows ? g + 8 : rows - 1;
  const cv_v2i v0 = *(const cv_v2i*)(tile + r0 * ld + 8 * t), v1 = *(const cv_v2i*)(tile + r1 * ld + 8 * t);
  *lo = cv_frag_i8{v0.x, v1.x}; // logical K 4t..4t+3 of rows g, g+8
  *hi = cv_frag_i8{v0.y, v1.y}; // logical K 16+4t..16+4t+3
}
CV_DEVICE cv_frag_i8 cv_frag_nibbles(cv_frag_i8 f, int shift) {
  return cv_frag_i8{(f.lo >> shift) & 0x0F0F0F0F, (f.hi >> shift) & 0x0F0F0F0F};
}
#elif CV_HAS_WMMA
CV_DEVICE void cv_load_frags_k32(const cv_i8* tile, long ld, int rows, cv_frag_i8* lo, cv_frag_i8* hi) {
  const int r = (int)(cv_lane() & 15), row = r < rows ? r : rows - 1;
  *lo = *(const cv_v4i*)(tile + row * ld);
  *hi = *(const cv_v4i*)(tile + row * ld + 16);
}
CV_DEVICE cv_frag_i8 cv_frag_nibbles(cv_frag_i8 f, int shift) { return (f >> shift) & 0x0F0F0F0F; }
#else
CV_DEVICE void cv_load_frags_k32(const cv_i8* tile, long ld, int rows, cv_frag_i8* lo, cv_frag_i8* hi) {
  *lo = cv_frag_i8{tile, (int)ld, rows, -1};
  *hi = cv_frag_i8{tile + 16, (int)ld, rows, -1};
}
CV_DEVICE cv_frag_i8 cv_frag_nibbles(cv_frag_i8 f, int shift) { return cv_frag_i8{f.tile, f.ld, f.rows, shift}; }
#endif
// Row and column of accumulator element i for this lane.
// Row-wise reductions over an accumulator tile (attention's softmax): elements i and j of one
// lane lie in the same row iff cv_acc_same_row(i, j), and the other elements of that row are
// held by the CV_ACC_ROW_LANES adjacent lanes of the lane's group (cv_group_sum/max width).
#if defined(CV_HAS_MMA_SYNC)
CV_DEVICE int cv_acc_row(int i) { return (int)(cv_lane() >> 2) + 8 * ((i & 3) >> 1); }
CV_DEVICE int cv_acc_col(int i) { return 8 * (i >> 2) + 2 * (int)(cv_lane() & 3) + (i & 1); }
CV_DEVICE bool cv_acc_same_row(int i, int j) { return ((i & 3) >> 1) == ((j & 3) >> 1); }
#define CV_ACC_ROW_LANES 4u
#else
CV_DEVICE int cv_acc_row(int i) { return 2 * i + (int)(cv_lane() >> 4); }
CV_DEVICE int cv_acc_col(int i) { (void)i; return (int)(cv_lane() & 15); }
CV_DEVICE bool cv_acc_same_row(int i, int j) { return i == j; }
#define CV_ACC_ROW_LANES 16u
#endif
