#!/usr/bin/env bash
# Session 8, device call 1b (same warm machine as 1a): civetta bench on the 1.4B Q8_0 / Q4_K models
# (kernel timing off / every launch / 5%), llama-bench -fa 0,1 on them, then the MoE bench
# (scripts/gpu-moe.sh bench llama on the 48-layer file) and its summary.
set -uo pipefail
G=$PWD/.gpu; O=$OUT; K=$G/kernels/sm_90; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
[[ -f /tmp/s8/synth.done ]] || { stamp "waiting for synth"; timeout 200 bash -c 'until [[ -f /tmp/s8/synth.done ]]; do sleep 2; done'; }
tail -3 $OUT/../1a/synth.log 2>/dev/null; ls -la /tmp/s8 /tmp/g15
for q in q8_0 q4_k; do
  M=/tmp/s8/m-$q.gguf
  common=(bench -m $M --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json)
  stamp "civetta bench $q: timing off, on (every launch), on (5%)"
  $G/civetta "${common[@]}" --kernel-timing off > $O/civ-$q-off.json 2>> $O/bench.err
  $G/civetta "${common[@]}" --kernel-timing on --sample-rate 1 > $O/civ-$q-on.json 2>> $O/bench.err
  $G/civetta "${common[@]}" --kernel-timing on --sample-rate 0.05 > $O/civ-$q-on5.json 2>> $O/bench.err
done
for q in q8_0 q4_k; do
  M=/tmp/s8/m-$q.gguf
  for kd in kernels kernels-new; do for tile in auto 64x64 128x128; do
    stamp "GEMM A/B $q $kd tile $tile"
    $G/civetta bench -m $M --backend cuda --kernel-dir $G/$kd/sm_90 -p 512,2048 -n 0 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json \
      --kernel-timing off --gpu-gemm-tile $tile > $O/ab-$q-$kd-$tile.json 2>> $O/bench.err
  done; done
done
python3 - $O <<'PY'
import json, sys, os, glob
for p in sorted(glob.glob(os.path.join(sys.argv[1], "ab-*.json"))):
    try: d = json.load(open(p))
    except Exception: print(os.path.basename(p), "unreadable"); continue
    print(os.path.basename(p), [(t["name"], round(t["mean_tps"], 1)) for t in d["tests"]], (d.get("hashes") or {}).get("overall_sha256", "")[:16])
PY
stamp "waiting for llama.cpp"
bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"
for q in q8_0 q4_k; do
  stamp "llama-bench $q -fa 0,1"
  /tmp/llama.cpp/build/bin/llama-bench -m /tmp/s8/m-$q.gguf -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > $O/llama-$q.json 2> $O/llama-$q.err || tail -3 $O/llama-$q.err
done
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
def L(p):
    try: return json.load(open(os.path.join(o, p)))
    except Exception as e: return None
print("| model | test | civetta off | on (every) | on 5% | llama fa0 | llama fa1 | ratio fa0 | ratio fa1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for q in ("q8_0", "q4_k"):
    off, on, on5, ll = (L(f"civ-{q}-{x}.json") for x in ("off", "on", "on5")), None, None, L(f"llama-{q}.json")
    off, on, on5 = off
    for t in (off or {}).get("tests", []):
        n = int(t["name"][2:]); kind = t["kind"]
        def lt(fa):
            for r in ll or []:
                if r.get("flash_attn") in (fa, bool(fa)) and ((kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0) or (kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)): return r["avg_ts"]
        g = lambda d: next((x["mean_tps"] for x in (d or {}).get("tests", []) if x["name"] == t["name"]), 0)
        l0, l1 = lt(0) or 0, lt(1) or 0
        print(f"| {q} | {t['name']} | {t['mean_tps']:.1f} | {g(on):.1f} | {g(on5):.1f} | {l0:.1f} | {l1:.1f} | {t['mean_tps']/l0 if l0 else 0:.3f} | {t['mean_tps']/l1 if l1 else 0:.3f} |")
PY
stamp "MoE bench (scripts/gpu-moe.sh bench llama, 48 layers)"
OUT=$O LAYERS=48 REPS=3 bash $G/15/run.sh bench llama 2>&1 | tail -20
stamp done
