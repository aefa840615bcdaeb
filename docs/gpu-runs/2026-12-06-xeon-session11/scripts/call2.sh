#!/usr/bin/env bash
# Session 11, device call 2 (Xeon host, CPU only): the spinning pool with one claim lane per
# thread (stealing from the others) and per-head attention items at 16 threads ("lanes") against
# main 34ebe46 and the no-AMX llama-bench.
set -uo pipefail
D=$PWD/.gpu/s11/ab; A=$D/civetta; B=$D/civetta-lanes; M=/tmp/cpu-ab-models; mkdir -p $M; t0=$(date +%s)
export LD_LIBRARY_PATH=$D/llama/bin
nproc; grep -m1 "model name" /proc/cpuinfo; lscpu | grep -E "L3|Socket|NUMA node\(s\)"
$B model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied -o $M/smol-q4_1.gguf > /dev/null
$B model synth --arch llama --quant q4_k --size 1b -o $M/1b-q4_k.gguf > /dev/null
$B model synth --arch llama --quant q8_0 --size 1b -o $M/1b-q8_0.gguf > /dev/null
$B model synth --arch gemma3 --quant q5_0 --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --tied -o $M/gemma270m-q5_0.gguf > /dev/null
echo "models ready after $(( $(date +%s) - t0 )) s"
echo "== pool overhead (lanes build)"; timeout 60 $D/pool_overhead 8,16
for c in "smol-q4_1 16 512 128 3" "1b-q4_k 16 512 128 2" "1b-q8_0 16 512 128 2" "smol-q4_1 8 512 128 2" "gemma270m-q5_0 16 512 128 2"; do
  read -r name threads pp tg rounds <<< "$c"
  if (( $(date +%s) - t0 > 420 )); then echo "time spent: skipped $c"; continue; fi
  pin=(); (( threads < 16 )) && pin=(taskset -c 0-$((threads - 1)))
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$D/llama timeout 150 "${pin[@]}" \
    python3 scripts/perf-ab.py $rounds "$A" "$B" LLAMA 2>&1
  echo "-- after $(( $(date +%s) - t0 )) s"
done
echo "== kernel profile, smol-q4_1, 16 threads, tg128, lanes"
$B bench -m $M/smol-q4_1.gguf -t 16 -p 0 -n 128 -r 1 --warmup 1 --hash-tokens 0 --kernel-timing on 2>&1 | grep -E "^\| (tg|matmul|attention|rope|rmsnorm|silu|add)"
echo "done after $(( $(date +%s) - t0 )) s"
