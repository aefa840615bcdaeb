#!/usr/bin/env bash
# Issue #17 session 3, device run 1: decode mat-vec on int8 activations (dp4a) vs the wave kernels.
# parity (gpu_check, default = dp4a), matvec_bench per variant (with a CPU reference), civetta bench
# tg128/pp512 per variant on the 1.4B Q8_0 / Q4_K synthetic models. Results under $OUT/17.
set -uo pipefail
G=.gpu/17
O="$OUT/17"
mkdir -p "$O" /tmp/g17
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
tar xJf $G/bin.tar.xz -C /tmp/g17 || { echo "unpack failed"; exit 1; }
B=/tmp/g17
K=$G/kernels/sm_90
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1
stamp "ptxas"
for f in matvec_dp4a quantize matvec; do ptxas -arch=sm_90 -v $K/$f.ptx -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
  | sed -E "s/ptxas info *: //g" > "$O/ptxas.txt" 2>&1
M8=/tmp/g17/m-q8_0.gguf; M4=/tmp/g17/m-q4_k.gguf
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
stamp "synth (background) + parity (dp4a)"
( $B/civetta model synth $SZ --quant q8_0 -o $M8 > "$O/synth.log" 2>&1; $B/civetta model synth $SZ --quant q4_k -o $M4 >> "$O/synth.log" 2>&1 ) & sp=$!
timeout 150 $B/gpu_check --backend cuda --kernel-dir $K > "$O/parity.md" 2> "$O/parity.err"; echo "parity rc=$?"
grep -E "FAIL|DIFFER|all models|error|panick" "$O/parity.md" "$O/parity.err" | head -8
wait $sp
V=wave,dp4a,dp4a-g32,dp4a-g64,dp4a-g128
for m in q8_0 q4_k; do
  stamp "matvec_bench $m"; timeout 90 $B/matvec_bench -m /tmp/g17/m-$m.gguf --kernel-dir $K --rows 1,4 --iters 100 --variants $V > "$O/matvec-$m.md" 2> "$O/matvec-$m.err"
  tail -2 "$O/matvec-$m.err"
done
BA=(bench --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing off)
for m in q8_0 q4_k; do
  for v in dp4a wave; do
    stamp "bench $m $v"; timeout 60 $B/civetta "${BA[@]}" -m /tmp/g17/m-$m.gguf --gpu-matvec $v > "$O/civetta-$m-$v.json" 2>> "$O/bench.err"
  done
done
stamp "profile q8_0 dp4a (timing on, 5%)"
timeout 60 $B/civetta bench --backend cuda --kernel-dir $K -p 512 -n 128 -r 2 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing on --sample-rate 0.05 -m $M8 > "$O/civetta-q8_0-dp4a-on5.json" 2>> "$O/bench.err"
stamp "summary"
python3 - "$O" <<'PY'
import json, os, sys
o = sys.argv[1]
ll = {"q8_0": 500.4, "q4_k": 561.7}  # llama.cpp CUDA tg128, docs/gpu-runs/2026-12-04-h200-graphs (run 1)
for m in ("q8_0", "q4_k"):
    for v in ("dp4a", "wave"):
        try: r = json.load(open(os.path.join(o, f"civetta-{m}-{v}.json")))
        except Exception as e: print(m, v, "no result", e); continue
        print(m, v, " ".join(f"{t['name']} {t['mean_tps']:.1f}" for t in r["tests"]), f"(llama.cpp tg128 {ll[m]})")
try:
    on = json.load(open(os.path.join(o, "civetta-q8_0-dp4a-on5.json")))
    for k in sorted(on["profile"]["kernels"], key=lambda k: -k.get("total_seconds", 0))[:10]:
        print(k["kernel"], k["shape_class"], k["calls"], f'{k.get("mean_seconds", 0) * 1e6:.1f}us', f'{k.get("total_seconds", 0):.3f}s')
except Exception as e: print("profile:", e)
PY
grep -h "| 1 |" "$O"/matvec-*.md | awk -F'|' '{print $2,$4,$6,$8,$10,$11,$12}' | head -60
cat "$O/ptxas.txt" | grep -E "q8p_g32'|q4k_g32'|q8p_g128'|q4k_g128'|quantize_q8_1" -A0 | cut -c1-200
tail -3 "$O/parity.md"
stamp "done"
