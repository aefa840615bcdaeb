#!/usr/bin/env bash
# Session 10, device call 2: #18's "ratio against llama.cpp with AMX" (no target): llama-bench built
# natively on the Xeon (GGML_NATIVE=ON, so AMX on), same 6 cases, civetta main 394e84a vs it.
set -uo pipefail
D=$PWD/.gpu/s10/ab; O=$OUT; t0=$(date +%s)
rm -rf /tmp/llama.cpp && tar xJf .gpu/llama.cpp-src.tar.xz -C /tmp && cd /tmp/llama.cpp
cmake -S . -B build-amx -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > $O/amx-build.log 2>&1 &&
  cmake --build build-amx --target llama-bench -j 16 >> $O/amx-build.log 2>&1; echo "build rc=$? after $(( $(date +%s) - t0 )) s"
mkdir -p /tmp/amx && ln -sf /tmp/llama.cpp/build-amx/bin /tmp/amx/bin
/tmp/amx/bin/llama-bench --help > /dev/null 2>&1 || { tail -20 $O/amx-build.log; exit 1; }
grep -i "amx" $O/amx-build.log | head -5
cd - > /dev/null; M=/tmp/cpu-ab-models; mkdir -p $M
$D/civetta-after model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied -o $M/smol-q4_1.gguf > /dev/null
$D/civetta-after model synth --arch llama --quant q4_k --size 1b -o $M/1b-q4_k.gguf > /dev/null
$D/civetta-after model synth --arch llama --quant q8_0 --size 1b -o $M/1b-q8_0.gguf > /dev/null
for c in "smol-q4_1 16 512 128" "1b-q4_k 16 512 128" "1b-q8_0 16 512 128" "smol-q4_1 2 512 128" "1b-q4_k 2 128 32" "1b-q8_0 2 128 32"; do
  read -r name threads pp tg <<< "$c"; pin=(); [[ $threads == 2 ]] && pin=(taskset -c 0,1)
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=/tmp/amx timeout 200 "${pin[@]}" python3 scripts/perf-ab.py 2 $D/civetta-after LLAMA 2>&1
done
echo "done after $(( $(date +%s) - t0 )) s"
