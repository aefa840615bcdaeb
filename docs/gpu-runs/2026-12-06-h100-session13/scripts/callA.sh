#!/usr/bin/env bash
# Session 13, device call A: llama.cpp CUDA build and the 48-layer Qwen3-30B-A3B-shaped Q4_K synth
# in the background; gpu_check of the raw-block Q4_K GEMM (bit-equal to the f16 copies) and
# gpt-oss; the 1.4B dense Q4_K prefill A/B raw vs copies; the 48-layer bench once synthesised.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/A; mkdir -p $O /tmp/g13
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $O/gpu.txt
JOBS=12 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
for b in civetta gpu_check; do xz -dc $G/13/$b.xz > /tmp/g13/$b && chmod +x /tmp/g13/$b; done
K=$G/13/kernels/sm_90; CIV=/tmp/g13/civetta
M=/tmp/g13/q3moe-48l.gguf
setsid bash -c "s=\$(date +%s); $CIV model synth --arch qwen3moe --quant q4_k --size 1b --layers 48 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g13/tmp.gguf > /tmp/g13/synth.log 2>&1 && mv /tmp/g13/tmp.gguf $M; echo \"synth rc=\$? s=\$(( \$(date +%s) - s ))\" >> /tmp/g13/synth.log" > /dev/null 2>&1 < /dev/null &
ptxas -arch=sm_90 -v "$K/gemm_f16.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g" | cut -c1-200 > $O/ptxas-gemm.txt; cat $O/ptxas-gemm.txt
stamp "gpu_check: raw Q4_K vs f16 copies; gpt-oss"
timeout 200 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs llama,qwen3,qwen3moe,qwen2moe,gpt-oss --quants q4_k > $O/parity-q4k.md 2> $O/parity-q4k.err; echo "rc=$?"
grep -E "^\| [a-z]|raw Q4_K|gpu_check" $O/parity-q4k.md | cut -c1-220; tail -3 $O/parity-q4k.err
timeout 100 /tmp/g13/gpu_check --backend cuda --kernel-dir $K --archs gpt-oss --quants mxfp4 > $O/parity-mxfp4.md 2> $O/parity-mxfp4.err; echo "rc=$?"
grep -E "^\| [a-z]|gpu_check" $O/parity-mxfp4.md | cut -c1-220
stamp "1.4B dense Q4_K: prefill raw vs f16 copies (interleaved)"
D=/tmp/g13/dense-q4k.gguf
$CIV model synth --arch llama --quant q4_k --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192 -o $D > /dev/null 2>&1
for r in 1 2; do for c in false true; do
  timeout 100 $CIV bench --backend cuda --kernel-dir $K -m $D -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing off --gpu-q4k-f16-copies $c > $O/dense-copies-$c-$r.json 2>> $O/dense.err
  python3 -c "import json; d=json.load(open('$O/dense-copies-$c-$r.json')); print('copies=$c round $r', [(t['name'], round(t['mean_tps'],1)) for t in d['tests']], d['hashes'].get('overall_sha256', '')[:16])" 2>&1 | tail -1
done; done
stamp "waiting for the 48-layer synth"
timeout 300 bash -c "until [[ -s $M ]]; do sleep 3; done"; tail -1 /tmp/g13/synth.log; ls -la $M
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
stamp "civetta bench 48 layers"
timeout 200 $CIV "${BA[@]}" > $O/civetta48.json 2> $O/civetta48.err; echo rc=$?
python3 -c "import json; d=json.load(open('$O/civetta48.json')); print([(t['name'], round(t['mean_tps'],1), [round(x,1) for x in t.get('samples_tps',[])]) for t in d['tests']], d['hashes'].get('overall_sha256','')[:16])" 2>&1 | tail -1
tail -2 $O/civetta48.err; nvidia-smi --query-gpu=memory.used --format=csv,noheader
stamp "llama build state"; tail -1 /tmp/llama.cpp/build.log 2>/dev/null; cat /tmp/llama.cpp/build.rc 2>/dev/null
stamp done
