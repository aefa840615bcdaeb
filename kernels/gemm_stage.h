// gemm_stage.h: register staging of one K stage of a GEMM tile, shared by the staged GEMMs
// (gemm_w8a8.hip, gemm_f16.hip). Rows [row0, row0+ROWS) x [k0, k0+BK) of a row-major [rows][K]
// matrix of T are fetched as 16-byte vectors into registers (zero past `rows` or K), so the
// loads are in flight while the previous stage's matrix steps run, and stored to a padded LDS
// tile afterwards.
#pragma once
#include "civetta_gpu.h"

template <typename T, int ROWS, int BK, int THREADS>
struct StageRows {
  static constexpr int kPerChunk = 16 / (int)sizeof(T); // elements per 16-byte vector
  static constexpr int kChunks = BK / kPerChunk;        // vectors per row and stage
  static constexpr int kVecs = ROWS * kChunks / THREADS;
  static_assert(ROWS * kChunks % THREADS == 0, "stage splits evenly over the threads");
  cv_v4i v[kVecs];

  __device__ __attribute__((always_inline)) void fetch(const T* src, int row0, int rows, int K, int k0) {
    const int tid = (int)cv_tid_x();
    CV_UNROLL for (int i = 0; i < kVecs; ++i) {
      const int c = tid + i * THREADS, r = c / kChunks, k = k0 + (c % kChunks) * kPerChunk;
      v[i] = (cv_v4i){0, 0, 0, 0};
      if (row0 + r < rows && k < K) v[i] = *(const cv_v4i*)(src + (long)(row0 + r) * K + k);
    }
  }
  // `stride`: the LDS tile's row stride in elements.
  __device__ __attribute__((always_inline)) void store(T* tile, int stride) const {
    const int tid = (int)cv_tid_x();
    CV_UNROLL for (int i = 0; i < kVecs; ++i) {
      const int c = tid + i * THREADS;
      *(cv_v4i*)(tile + (c / kChunks) * stride + (c % kChunks) * kPerChunk) = v[i];
    }
  }
};
