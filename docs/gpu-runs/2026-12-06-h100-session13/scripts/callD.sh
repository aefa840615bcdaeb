#!/usr/bin/env bash
# Session 13, device call D: gpt-oss decode routed on the device (router bias in moe_topk, expert
# biases in moe_matvec, swiglu_oai in quantize_q8_1): gpu_check gpt-oss and the qwen MoE models
# (device vs host routing lines), then an 8-layer gpt-oss-20b-shaped MXFP4 model (dim 2880,
# 45/9 heads of 64, 32 experts, top-4, expert ffn 2880, vocab 201088) benched with device vs host
# routing, interleaved.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/D; mkdir -p $O /tmp/g13
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $O/gpu.txt
for b in civetta gpu_check; do xz -dc $G/13/$b.xz > /tmp/g13/$b && chmod +x /tmp/g13/$b; done
K=$G/13/kernels/sm_90; CIV=/tmp/g13/civetta
M=/tmp/g13/gptoss-8l.gguf
( s=$(date +%s); $CIV model synth --arch gpt-oss --quant mxfp4 --size 1b --layers 8 --dim 2880 --heads 45 --kv-heads 9 --experts 32 --experts-used 4 \
   --expert-ffn 2880 --vocab 201088 --context 4096 -o /tmp/g13/tmp-go.gguf > /tmp/g13/synth-go.log 2>&1 && mv /tmp/g13/tmp-go.gguf $M; echo "synth rc=$? s=$(( $(date +%s) - s ))" >> /tmp/g13/synth-go.log ) &
for f in moe moe_matvec quantize; do ptxas -arch=sm_90 -v "$K/$f.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g"; done > $O/ptxas.txt
grep -c "0 bytes spill stores" $O/ptxas.txt; grep -v " 0 bytes spill stores, 0 bytes spill loads" $O/ptxas.txt | cut -c1-200 | head -3
stamp "gpu_check gpt-oss, qwen3moe, qwen2moe"
timeout 240 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs gpt-oss,qwen3moe,qwen2moe --quants mxfp4,q8_0,q4_k > $O/parity.md 2> $O/parity.err; echo "rc=$?"
grep -E "^\| [a-z]|device routing|gpu_check" $O/parity.md | cut -c1-230; tail -3 $O/parity.err
stamp "waiting for the gpt-oss synth"
timeout 200 bash -c "until [[ -s $M ]]; do sleep 2; done"; cat /tmp/g13/synth-go.log | tail -2; ls -la $M
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
for r in 1 2; do for dr in true false; do
  timeout 120 $CIV "${BA[@]}" --gpu-moe-device-routing $dr > $O/gptoss-dr-$dr-$r.json 2>> $O/bench.err
  python3 -c "import json; d=json.load(open('$O/gptoss-dr-$dr-$r.json')); print('device routing $dr round $r', [(t['name'], round(t['mean_tps'],1)) for t in d['tests']], d['hashes'].get('overall_sha256','')[:16])" 2>&1 | tail -1
done; done
tail -2 $O/bench.err
stamp done
