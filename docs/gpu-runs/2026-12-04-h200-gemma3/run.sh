#!/usr/bin/env bash
# Issue #16 device run: gemma3 (head size 256, sliding window, Q5_0/Q5_1, GeGLU) on the CUDA
# backend vs the CPU backend (examples/gpu_check), plus ptxas resources of the new kernels.
# Run from the repo root; results under $OUT/16/. .gpu/16 held the stripped release builds of
# civetta and examples/gpu_check (--features cuda) and `make kernels-ptx` output (clang-22).
set -uo pipefail
D=.gpu/16
R="$OUT/16"
mkdir -p "$R"
K="$D/kernels/sm_90"
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$R/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$R/gpu.txt"
head -1 "$K/compiler.txt"

stamp "ptxas -v (sm_90) of the changed/new kernel files"
for f in attention gemma matvec_q5; do
  ptxas -arch=sm_90 -v "$K/$f.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - 
done | sed -E "s/ptxas info *: //g" > "$R/ptxas.txt"
cat "$R/ptxas.txt"

stamp "parity gemma3: every weight type (4 heads, 1 KV head, head 256, window 8)"
timeout 300 "$D/gpu_check" --backend cuda --kernel-dir "$K" --archs gemma3 \
  --quants f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k,q5_k,q6_k 2>&1 | tee "$R/parity-gemma3.md"
echo "rc=${PIPESTATUS[0]}" | tee -a "$R/parity-gemma3.md"

stamp "parity llama/qwen3 (head 64/128, the attention kernels' new window argument; Q5_0/Q5_1 on other archs)"
timeout 150 "$D/gpu_check" --backend cuda --kernel-dir "$K" --archs llama,qwen3 --quants f16,q8_0,q5_0,q5_1,q4_k 2>&1 | tee "$R/parity-others.md"
echo "rc=${PIPESTATUS[0]}" | tee -a "$R/parity-others.md"

stamp "Gemma-3-270M-shaped synthetic model (dim 640: Q5_0 rows of 20 blocks), generate on CUDA and CPU"
M=/tmp/gemma3-270m-shape-q5_0.gguf
"$D/civetta" model synth --arch gemma3 --quant q5_0 --size small --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 32000 -o $M 2>&1 | tail -2
for be in cuda cpu; do
  timeout 90 "$D/civetta" generate -m $M --backend $be --kernel-dir "$K" --prompt-tokens 2,818,5279,529,7001,563,1,2,3,4,5,6,7,8,9,10,11,12 -n 24 --temperature 0 --ignore-eos --json > "$R/generate-$be.json" 2> "$R/generate-$be.log"
  echo "generate $be rc=$?"
done
python3 - "$R/generate-cuda.json" "$R/generate-cpu.json" <<'PY' 2>&1 | tee "$R/generate-compare.txt"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ids = lambda j: j.get("token_ids") or j.get("tokens") or j.get("ids")
ta, tb = ids(a), ids(b)
print("cuda:", ta); print("cpu: ", tb)
print("greedy 24 on the Gemma-shaped model:", "EQUAL" if ta == tb else "DIFFER at %s" % next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None))
PY
stamp "bench on the Gemma-shaped model (CUDA)"
timeout 90 "$D/civetta" bench -m $M --backend cuda --kernel-dir "$K" -p 512 -n 128 -r 3 --kernel-timing off 2>&1 | tail -8 | tee "$R/bench-cuda.txt"
stamp "done"
echo "== summary =="; grep -h -E "gpu_check|FAIL|rc=" "$R"/parity-*.md; tail -1 "$R/generate-compare.txt"; tail -4 "$R/bench-cuda.txt"
