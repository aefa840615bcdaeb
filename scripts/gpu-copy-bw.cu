// Device-to-device copy bandwidth of GPU 0 (the roofline denominator of docs/GPU.md): 1 GiB
// copied 10 times after a warm-up, median time, read + write bytes over it (as matvec_bench).
// Built and run on the GPU machine by scripts/gpu-moe.sh: nvcc -O2 -o copy-bw gpu-copy-bw.cu
#include <algorithm>
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>

int main() {
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(a, 1, bytes);
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
  cudaEvent_t s, e;
  cudaEventCreate(&s);
  cudaEventCreate(&e);
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(s);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e);
    cudaEventSynchronize(e);
    float t = 0;
    cudaEventElapsedTime(&t, s, e);
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double t = ms[ms.size() / 2] / 1e3;
  std::printf("copy_gbs %.1f\n", 2.0 * bytes / t / 1e9);
  return 0;
}
