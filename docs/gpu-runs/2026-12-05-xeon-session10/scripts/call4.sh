#!/usr/bin/env bash
# Session 10, device call 4 (after: runs of claimed items, yielding waits): #18's thread pools on the idle Xeon host. One binary (the working
# tree with src/backend/cpu/pool.rs), CIVETTA_CPU_POOL=rayon vs =spin vs the no-AMX llama-bench;
# 16 threads unpinned, 2/4/8 threads pinned to the first cores (taskset).
set -uo pipefail
D=$PWD/.gpu/s10/ab; B=$D/civetta-pool; M=/tmp/cpu-ab-models; mkdir -p $M; t0=$(date +%s)
export LD_LIBRARY_PATH=$D/llama/bin
$B model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied -o $M/smol-q4_1.gguf > /dev/null
$B model synth --arch llama --quant q4_k --size 1b -o $M/1b-q4_k.gguf > /dev/null
$B model synth --arch llama --quant q8_0 --size 1b -o $M/1b-q8_0.gguf > /dev/null
$B model synth --arch gemma3 --quant q5_0 --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --tied -o $M/gemma270m-q5_0.gguf > /dev/null
$B bench -m $M/smol-q4_1.gguf -t 16 -p 16 -n 4 -r 1 --warmup 0 --hash-tokens 0 -q 2>&1 | grep pool
echo "models ready after $(( $(date +%s) - t0 )) s"
for c in "smol-q4_1 16 512 128 3" "1b-q4_k 16 512 128 3" "1b-q8_0 16 512 128 3" "smol-q4_1 8 512 128 2" "smol-q4_1 4 512 128 2" \
         "smol-q4_1 2 512 128 2" "1b-q4_k 4 128 32 2" "gemma270m-q5_0 16 512 128 2"; do
  read -r name threads pp tg rounds <<< "$c"
  if (( $(date +%s) - t0 > 500 )); then echo "time spent: skipped $c"; continue; fi
  pin=(); (( threads < 16 )) && pin=(taskset -c 0-$((threads - 1)))
  MODEL=$M/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$D/llama timeout 240 "${pin[@]}" \
    python3 scripts/perf-ab.py $rounds "$B CIVETTA_CPU_POOL=rayon" "$B CIVETTA_CPU_POOL=spin" LLAMA 2>&1
done
for name in 1b-q8_0 smol-q4_1 1b-q4_k; do
  echo "== prefill chunk, $name, 16 threads (spin pool)"
  MODEL=$M/$name.gguf THREADS=16 PP=512 TG=16 timeout 120 python3 scripts/perf-ab.py 2 "$B" "$B --prefill-batch=256" "$B --prefill-batch=512" 2>&1
done
for pool in rayon spin; do
  echo "== kernel profile, smol-q4_1, 16 threads, tg128, $pool"
  CIVETTA_CPU_POOL=$pool $B bench -m $M/smol-q4_1.gguf -t 16 -p 0 -n 128 -r 1 --warmup 1 --hash-tokens 0 --kernel-timing on 2>&1 | grep -E "^\| (tg|gemm|attention|norm|elementwise|matmul|add|rope|rmsnorm|silu|kv_store|embed)"
done
echo "done after $(( $(date +%s) - t0 )) s"
