#!/usr/bin/env bash
# Session 11, device call 1: #18 on the idle Xeon host (CPU only). main 34ebe46 (Q4_K and Q8_0
# repacked, spinning pool from 8 threads) vs the same binary with --cpu-repack=false vs the no-AMX
# llama-bench; 2 threads pinned (taskset -c 0,1), 16 threads unpinned. Then what the 16-thread
# SmolLM2 decode spends its time on: a per-kernel profile and a thread sweep.
set -uo pipefail
D=$PWD/.gpu/s11/ab; B=$D/civetta; M=/tmp/cpu-ab-models; mkdir -p $M; t0=$(date +%s)
export LD_LIBRARY_PATH=$D/llama/bin
nproc; grep -m1 "model name" /proc/cpuinfo
$B model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied -o $M/smol-q4_1.gguf > /dev/null
$B model synth --arch llama --quant q4_k --size 1b -o $M/1b-q4_k.gguf > /dev/null
$B model synth --arch llama --quant q8_0 --size 1b -o $M/1b-q8_0.gguf > /dev/null
echo "models ready after $(( $(date +%s) - t0 )) s"
for c in "1b-q8_0 16 512 128 3" "smol-q4_1 16 512 128 3" "1b-q8_0 2 128 32 2" "1b-q4_k 16 512 128 2"; do
  read -r name threads pp tg rounds <<< "$c"
  pin=(); (( threads < 16 )) && pin=(taskset -c 0-$((threads - 1)))
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$D/llama timeout 150 "${pin[@]}" \
    python3 scripts/perf-ab.py $rounds "$B --cpu-repack=false" "$B" LLAMA 2>&1
  echo "-- after $(( $(date +%s) - t0 )) s"
done
echo "== kernel profile, smol-q4_1, 16 threads, tg128"
$B bench -m $M/smol-q4_1.gguf -t 16 -p 0 -n 128 -r 1 --warmup 1 --hash-tokens 0 --kernel-timing on 2>&1 | grep -E "^\|"
echo "== smol-q4_1 tg128 by thread count (civetta, then llama-bench)"
for t in 4 8 12 16; do echo "civetta -t $t: $($B bench -m $M/smol-q4_1.gguf -t $t -p 0 -n 128 -r 2 --warmup 1 --hash-tokens 0 -q 2>&1 | grep -E '^\| tg')"; done
$D/llama/bin/llama-bench -m $M/smol-q4_1.gguf -t 8,12,16 -p 0 -n 128 -r 2 2>&1 | grep -E "tg128"
echo "-- after $(( $(date +%s) - t0 )) s"
for c in "smol-q4_1 8 512 128 2" "smol-q4_1 4 512 128 2"; do
  read -r name threads pp tg rounds <<< "$c"
  if (( $(date +%s) - t0 > 480 )); then echo "time spent: skipped $c"; continue; fi
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$D/llama timeout 90 taskset -c 0-$((threads - 1)) \
    python3 scripts/perf-ab.py $rounds "$B CIVETTA_CPU_POOL=rayon" "$B CIVETTA_CPU_POOL=spin" LLAMA 2>&1
done
echo "done after $(( $(date +%s) - t0 )) s"
