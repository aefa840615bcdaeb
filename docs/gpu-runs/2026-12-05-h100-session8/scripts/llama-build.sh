#!/usr/bin/env bash
# llama.cpp CUDA (sm_90, flash-attention kernels compiled) from the llama-cpp-python 0.3.36 sources
# in .gpu/llama.cpp-src.tar.xz; writes /tmp/llama.cpp/build.rc when done. Run in the background.
D=$(cd "$(dirname "$0")/.." && pwd)
L=/tmp/llama.cpp
[[ -f $L/build.rc && $(cat $L/build.rc) == 0 ]] && exit 0
rm -rf $L && tar xJf "$D/llama.cpp-src.tar.xz" -C /tmp
cd $L && s=$(date +%s)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DGGML_CUDA_FA=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF > build.log 2>&1 \
  && cmake --build build --target llama-bench -j ${JOBS:-12} >> build.log 2>&1
echo $? > build.rc
echo "seconds=$(( $(date +%s) - s ))" >> build.log
