#!/usr/bin/env bash
# Session 13, device call E: why MoE decode at 16 rows is slow (issue #14 / #15 serving): the
# batched decode step of an 8-layer Qwen3-30B-A3B-shaped Q4_K model and of the 1.4B dense Q8_0
# model (issue #14's GPU target: aggregate at 16 >= 8x at 1), per batch size, with a per-kernel
# profile (examples/batch_decode_bench --profile).
set -uo pipefail
G=$PWD/.gpu; O=$OUT/E; mkdir -p $O /tmp/g13
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $O/gpu.txt
for b in civetta batch_decode_bench; do xz -dc $G/13/$b.xz > /tmp/g13/$b && chmod +x /tmp/g13/$b; done
K=$G/13/kernels/sm_90; CIV=/tmp/g13/civetta
MOE=/tmp/g13/q3moe-8l.gguf; DENSE=/tmp/g13/dense-q8.gguf
$CIV model synth --arch qwen3moe --quant q4_k --size 1b --layers 8 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o $MOE > /dev/null 2>&1 &
$CIV model synth --arch llama --quant q8_0 --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192 -o $DENSE > /dev/null 2>&1
stamp "dense 1.4B Q8_0"
timeout 150 /tmp/g13/batch_decode_bench -m $DENSE --backend cuda --kernel-dir $K --batches 1,4,8,16 --steps 32 --profile > $O/dense.txt 2>&1; echo rc=$?
cat $O/dense.txt | cut -c1-160 | head -60
wait
stamp "MoE 8 layers Q4_K"
timeout 200 /tmp/g13/batch_decode_bench -m $MOE --backend cuda --kernel-dir $K --batches 1,4,8,16 --steps 32 --profile > $O/moe.txt 2>&1; echo rc=$?
cat $O/moe.txt | cut -c1-160 | head -80
stamp done
