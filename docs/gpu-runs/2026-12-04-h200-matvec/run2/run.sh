#!/usr/bin/env bash
# Issue #17 session 3, device run 2: dp4a decode mat-vec (Q4_K min term on quantised sums, 16-lane
# builds, RMSNorm writing the q8_1 input) + decode attention with 4 keys in flight per wave.
# parity (gpu_check, default = dp4a), matvec_bench per variant (CPU reference), civetta bench
# pp512/pp2048/tg128 per variant; attention before/after via a kernel folder with main's
# attention.ptx (kernels/sm_90_attn_main); kernel-timing overhead. Results under $OUT/17.
set -uo pipefail
G=.gpu/17
O="$OUT/17"
mkdir -p "$O" /tmp/g17
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
tar xJf $G/bin.tar.xz -C /tmp/g17 || { echo "unpack failed"; exit 1; }
B=/tmp/g17
K=$G/kernels/sm_90
KA=$G/kernels/sm_90_attn_main
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1
stamp "ptxas"
for f in matvec_dp4a quantize norm attention; do ptxas -arch=sm_90 -v $K/$f.ptx -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
  | sed -E "s/ptxas info *: //g" > "$O/ptxas.txt" 2>&1
M8=/tmp/g17/m-q8_0.gguf; M4=/tmp/g17/m-q4_k.gguf
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
stamp "synth (background) + parity (dp4a)"
( $B/civetta model synth $SZ --quant q8_0 -o $M8 > "$O/synth.log" 2>&1; $B/civetta model synth $SZ --quant q4_k -o $M4 >> "$O/synth.log" 2>&1 ) & sp=$!
timeout 150 $B/gpu_check --backend cuda --kernel-dir $K > "$O/parity.md" 2> "$O/parity.err"; echo "parity rc=$?"
grep -E "FAIL|DIFFER|all models|error|panick" "$O/parity.md" "$O/parity.err" | head -8
wait $sp
V=wave,dp4a,dp4a-g16,dp4a-g32,dp4a-g64,dp4a-g128
for m in q8_0 q4_k; do
  stamp "matvec_bench $m"; timeout 90 $B/matvec_bench -m /tmp/g17/m-$m.gguf --kernel-dir $K --rows 1,2,4 --iters 100 --variants $V > "$O/matvec-$m.md" 2> "$O/matvec-$m.err"
  tail -2 "$O/matvec-$m.err"
done
BA=(bench --backend cuda -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing off)
for m in q8_0 q4_k; do
  for v in dp4a dp4a-g16 wave; do
    stamp "bench $m $v"; timeout 60 $B/civetta "${BA[@]}" --kernel-dir $K -m /tmp/g17/m-$m.gguf --gpu-matvec $v > "$O/civetta-$m-$v.json" 2>> "$O/bench.err"
  done
  stamp "bench $m dp4a, main's attention"; timeout 60 $B/civetta "${BA[@]}" --kernel-dir $KA -m /tmp/g17/m-$m.gguf > "$O/civetta-$m-dp4a-attnmain.json" 2>> "$O/bench.err"
done
stamp "timing overhead q8_0 dp4a (5%, every launch)"
BT=(bench --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing on -m $M8)
timeout 60 $B/civetta "${BT[@]}" --sample-rate 0.05 > "$O/civetta-q8_0-dp4a-on5.json" 2>> "$O/bench.err"
timeout 60 $B/civetta "${BT[@]}" --sample-rate 1 > "$O/civetta-q8_0-dp4a-on.json" 2>> "$O/bench.err"
stamp "summary"
python3 - "$O" <<'PY'
import json, os, sys
o = sys.argv[1]
ll = {"q8_0": 500.4, "q4_k": 561.7}  # llama.cpp CUDA tg128, docs/gpu-runs/2026-12-04-h200-graphs (run 1)
def load(n):
    try: return json.load(open(os.path.join(o, n)))
    except Exception as e: return None
for m in ("q8_0", "q4_k"):
    for v in ("dp4a", "dp4a-g16", "wave", "dp4a-attnmain"):
        r = load(f"civetta-{m}-{v}.json")
        if not r: print(m, v, "no result"); continue
        print(m, v, " ".join(f"{t['name']} {t['mean_tps']:.1f}" for t in r["tests"]), f"(llama.cpp tg128 {ll[m]})")
off, on5, on = load("civetta-q8_0-dp4a.json"), load("civetta-q8_0-dp4a-on5.json"), load("civetta-q8_0-dp4a-on.json")
if off and on5 and on:
    for a, b, c in zip(off["tests"], on5["tests"], on["tests"]):
        print(f"timing {a['name']}: off {a['mean_tps']:.1f} on5 {b['mean_tps'] / a['mean_tps']:.3f} on1 {c['mean_tps'] / a['mean_tps']:.3f}")
if on5:
    for k in sorted(on5["profile"]["kernels"], key=lambda k: -k.get("total_seconds", 0))[:12]:
        print(k["kernel"], k["shape_class"], k["calls"], f'{k.get("total_seconds", 0):.3f}s')
PY
grep -h "| 1 |" "$O"/matvec-*.md | awk -F'|' '{print $2,$4,$6,$8,$10,$11,$12}' | grep -v "attn_k\|attn_v\|attn_output" | head -60
grep -E "q8p_g16'|q4k_g16'|rmsnorm_q8_1|attn_decode_pos_d128'" "$O/ptxas.txt" | cut -c1-200
tail -2 "$O/parity.md"
stamp "done"
