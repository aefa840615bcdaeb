// q4k.h: the scales of a ggml block_q4_K { f16 d, dmin; u8 scales[12]; u8 qs[128]; } (144 bytes per
// 256 values, 8 sub-blocks of 32), shared by the mat-vecs that read raw Q4_K blocks
// (matvec_dp4a.hip, matvec_mma.hip). Value i of sub-block s is d * sc[s] * q - dmin * mn[s].
#pragma once
#include "civetta_gpu.h"

namespace {

// Byte k (4..15) of a Q4_K block header held as 4 words.
CV_DEVICE int header_byte(const cv_v4i& h, int k) {
  const int word = k < 8 ? h.y : (k < 12 ? h.z : h.w);
  return (word >> (8 * (k & 3))) & 0xFF;
}
// 6-bit scale and min of sub-block j of a Q4_K super-block (ggml get_scale_min_k4 on
// scales[] = header bytes 4..15).
CV_DEVICE void q4k_scale_min(const cv_v4i& h, int j, float* sc, float* mn) {
  if (j < 4) {
    *sc = (float)(header_byte(h, 4 + j) & 63);
    *mn = (float)(header_byte(h, 8 + j) & 63);
  } else {
    const int s = header_byte(h, 8 + j);
    *sc = (float)((s & 0xF) | ((header_byte(h, j) >> 6) << 4));
    *mn = (float)((s >> 4) | ((header_byte(h, 4 + j) >> 6) << 4));
  }
}

} // namespace
