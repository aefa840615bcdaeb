// The weight units of the int8-activation mat-vecs (kernels/matvec_dp4a.hip, and the MoE
// expert mat-vec over device-side expert ids, kernels/moe_matvec.hip): how a lane loads one
// 16-byte unit of a weight row and multiplies it by the q8_1 activations (see matvec_dp4a.hip
// for the layouts). Included inside each file's anonymous namespace.
#pragma once

CV_DEVICE int dot16(const cv_v4i& w, const cv_v4i& x, int acc) {
  acc = cv_dot4_i8(w.x, x.x, acc);
  acc = cv_dot4_i8(w.y, x.y, acc);
  acc = cv_dot4_i8(w.z, x.z, acc);
  return cv_dot4_i8(w.w, x.w, acc);
}

// Q8_0 / Q5_0 as an int8 plane and an f16 scale per 32 values.
struct Q8Planes {
  static constexpr int kValues = 16;
  // Scalar fields: LLVM 23 left a {vector, float} unit array in scratch.
  struct Unit {
    int q0, q1, q2, q3;
    float d;
  };
  __device__ static __attribute__((always_inline)) Unit load(const cv_u8* W, const cv_u8* S, long row, int K, int u) {
    const cv_v4i q = *(const cv_v4i*)(W + row * K + u * 16);
    return Unit{q.x, q.y, q.z, q.w, (float)((const cv_half*)S)[row * (K / 32) + u / 2]};
  }
  // xq, xds: this activation row's.
  __device__ static __attribute__((always_inline)) float dot(const Unit& w, const cv_i8* xq, const float* xds, int u) {
    const cv_v4i xv = *(const cv_v4i*)(xq + u * 16);
    int acc = cv_dot4_i8(w.q0, xv.x, 0);
    acc = cv_dot4_i8(w.q1, xv.y, acc);
    acc = cv_dot4_i8(w.q2, xv.z, acc);
    acc = cv_dot4_i8(w.q3, xv.w, acc);
    return w.d * xds[(u / 2) * 2] * (float)acc;
  }
};

struct Q4K {
  static constexpr int kValues = 32;
  struct Unit {
    cv_v4i q;
    cv_v4i h;
  };
  __device__ static __attribute__((always_inline)) Unit load(const cv_u8* W, const cv_u8*, long row, int K, int u) {
    const cv_u8* blk = W + (row * (K / 256) + u / 8) * 144;
    const int c = u & 7;
    Unit w;
    w.h = *(const cv_v4i*)blk;
    w.q = *(const cv_v4i*)(blk + 16 + 32 * (c >> 1) + 16 * (c & 1));
    return w;
  }
  __device__ static __attribute__((always_inline)) float dot(const Unit& w, const cv_i8* xq, const float* xds, int u) {
    const int c = u & 7, j = c >> 1, half = c & 1;
    const int xo = (u / 8) * 256 + 64 * j + 16 * half;
    const cv_v4i x_lo = *(const cv_v4i*)(xq + xo), x_hi = *(const cv_v4i*)(xq + xo + 32);
    const cv_v4i q_lo = w.q & 0x0F0F0F0F, q_hi = (w.q >> 4) & 0x0F0F0F0F;
    const int dot_lo = dot16(q_lo, x_lo, 0), dot_hi = dot16(q_hi, x_hi, 0);
    const float* ds = xds + ((u / 8) * 8 + 2 * j) * 2; // q8 blocks 2j (low nibbles) and 2j+1
    const float d = (float)__builtin_bit_cast(cv_half, (cv_u16)(w.h.x & 0xFFFF));
    const float dmin = (float)__builtin_bit_cast(cv_half, (cv_u16)((cv_u32)w.h.x >> 16));
    float sc_lo, mn_lo, sc_hi, mn_hi;
    q4k_scale_min(w.h, 2 * j, &sc_lo, &mn_lo);
    q4k_scale_min(w.h, 2 * j + 1, &sc_hi, &mn_hi);
    float r = d * (sc_lo * ds[0] * (float)dot_lo + sc_hi * ds[2] * (float)dot_hi);
    // The min term needs the sum of all 32 inputs of each sub-block; the two lanes of a
    // sub-block pair (half 0 and 1) split its values, so only half 0 adds it, with the block
    // sums s = d * sum(q) of the quantiser.
    if (half == 0) r -= dmin * (mn_lo * ds[1] + mn_hi * ds[3]);
    return r;
  }
};
