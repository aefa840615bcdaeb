#!/usr/bin/env bash
# Bench models for session 8's calls: the 1.4B dense Q8_0 / Q4_K of scripts/gpu-check.sh and the
# 48-layer Qwen3-30B-A3B-shaped qwen3moe Q4_K of scripts/gpu-moe.sh. Writes /tmp/s8/synth.done.
G=$(cd "$(dirname "$0")/.." && pwd)
s=$(date +%s)
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
for q in q8_0 q4_k; do [[ -s /tmp/s8/m-$q.gguf ]] || { $G/civetta model synth $SZ --quant $q -o /tmp/s8/tmp-$q.gguf && mv /tmp/s8/tmp-$q.gguf /tmp/s8/m-$q.gguf; }; done
echo "dense done after $(( $(date +%s) - s )) s"
L=${MOE_LAYERS:-48}
M=/tmp/g15/q3moe-${L}l.gguf
[[ -s $M ]] || { $G/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers $L --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf && mv /tmp/g15/tmp.gguf $M; }
echo "synth rc=$? seconds=$(( $(date +%s) - s ))"
touch /tmp/s8/synth.done
