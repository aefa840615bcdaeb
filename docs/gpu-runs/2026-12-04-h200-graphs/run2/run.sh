#!/usr/bin/env bash
# Issue #17 device run 2 (llama.cpp numbers: run 1 of this session, same machine): parity (gpu_check incl. graphs vs eager bit-equality), speed with
# decode graphs vs eager launches, kernel-timing overhead, mat-vec micro-benchmark, and
# llama.cpp CUDA (FA off, as in docs/gpu-runs/2026-12-03-h200) on the same files.
set -uo pipefail
G=.gpu/17
O="$OUT/17"
mkdir -p "$O"
K=$G/kernels/sm_90
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1

stamp "ptxas (changed kernels)"
for f in matvec kv_cache attention; do ptxas -arch=sm_90 -v $K/$f.ptx -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
  | sed -E "s/ptxas info *: //g" > "$O/ptxas.txt" 2>&1
stamp "parity"
timeout 200 $G/gpu_check --backend cuda --kernel-dir $K > "$O/parity.md" 2> "$O/parity.err"; echo "parity rc=$?"
grep -E "FAIL|DIFFER|all models|error" "$O/parity.md" "$O/parity.err" | head -8

M8=/tmp/m-q8_0.gguf; M4=/tmp/m-q4_k.gguf; M6=/tmp/m-q6_k-1l.gguf
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
stamp "synth"
$G/civetta model synth $SZ --quant q8_0 -o $M8 > "$O/synth.log" 2>&1 & s1=$!
$G/civetta model synth $SZ --quant q4_k -o $M4 >> "$O/synth.log" 2>&1 & s2=$!
wait $s1 $s2
ls -la /tmp/m-*.gguf
B=(bench --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json)
for m in q8_0 q4_k; do
  f=/tmp/m-$m.gguf
  stamp "bench $m graphs"; timeout 90 $G/civetta "${B[@]}" -m $f --kernel-timing off > "$O/civetta-$m-graphs.json" 2> "$O/bench-$m.err"
  stamp "bench $m eager"; timeout 90 $G/civetta "${B[@]}" -m $f --kernel-timing off --gpu-eager > "$O/civetta-$m-eager.json" 2>> "$O/bench-$m.err"
  stamp "matvec_bench $m"; timeout 60 $G/matvec_bench -m $f --kernel-dir $K --rows 1,2,4,8 > "$O/matvec-$m.md" 2>&1
done
stamp "bench q8_0 timing on 5% / every launch (graphs)"
timeout 90 $G/civetta "${B[@]}" -m $M8 --kernel-timing on --sample-rate 0.05 > "$O/civetta-q8_0-on5.json" 2>> "$O/bench-q8_0.err"
timeout 90 $G/civetta "${B[@]}" -m $M8 --kernel-timing on --sample-rate 1 > "$O/civetta-q8_0-on.json" 2>> "$O/bench-q8_0.err"
stamp "q6_k matvec (1-layer model)"
$G/civetta model synth --arch llama --size 1b --layers 1 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 512 --quant q6_k -o $M6 > /dev/null 2>&1
timeout 40 $G/matvec_bench -m $M6 --kernel-dir $K --rows 1,4 > "$O/matvec-q6_k.md" 2>&1

stamp "summary"
python3 - "$O" <<'EOF'
import json, os, sys
o = sys.argv[1]
def load(p):
    try: return json.load(open(os.path.join(o, p)))
    except Exception as e: return None
for m in ("q8_0", "q4_k"):
    g, e = load(f"civetta-{m}-graphs.json"), load(f"civetta-{m}-eager.json")
    # llama.cpp CUDA (FA off) on the same synthetic files, run 1 of this session (16:08 UTC)
    ll = {"q8_0": [(512, 0, 25928.6), (2048, 0, 27132.0), (0, 128, 500.4)],
          "q4_k": [(512, 0, 24760.8), (2048, 0, 25351.1), (0, 128, 561.7)]}[m]
    ll = [{"n_prompt": p, "n_gen": n, "avg_ts": t} for p, n, t in ll]
    for i, name in enumerate(("pp512", "pp2048", "tg128")):
        gt = g["tests"][i]["mean_tps"] if g else 0
        et = e["tests"][i]["mean_tps"] if e else 0
        lt = 0
        for r in ll or []:
            if name.startswith("pp") and r["n_prompt"] == int(name[2:]) and r["n_gen"] == 0: lt = r["avg_ts"]
            if name.startswith("tg") and r["n_gen"] == int(name[2:]) and r["n_prompt"] == 0: lt = r["avg_ts"]
        print(f"{m} {name}: graphs {gt:.1f} eager {et:.1f} llama {lt:.1f} ratio {gt / lt if lt else 0:.2f}")
off, on5, on = load("civetta-q8_0-graphs.json"), load("civetta-q8_0-on5.json"), load("civetta-q8_0-on.json")
if off and on5 and on:
    for a, b, c in zip(off["tests"], on5["tests"], on["tests"]):
        print(f"timing {a['name']}: off {a['mean_tps']:.1f} on5 {b['mean_tps'] / a['mean_tps']:.3f} on1 {c['mean_tps'] / a['mean_tps']:.3f}")
EOF
grep -h "ffn_down\|attn_q\|copy bandwidth" "$O"/matvec-*.md | grep -v "| 8 |" | head -24
python3 - "$O/civetta-q8_0-on5.json" <<'EOF2' || true
import json, sys
on = json.load(open(sys.argv[1]))
for k in sorted(on["profile"]["kernels"], key=lambda k: -k.get("total_seconds", 0))[:12]:
    print(k["kernel"], k["shape_class"], k["calls"], f'{k.get("mean_seconds", 0) * 1e6:.1f}us', f'{k.get("total_seconds", 0):.3f}s')
EOF2
tail -3 "$O/parity.md"
stamp "done"
