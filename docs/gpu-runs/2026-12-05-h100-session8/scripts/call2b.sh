#!/usr/bin/env bash
# Session 8, device call 2b (same warm machine): final civetta bench (timing off / 5%) vs llama-bench
# -fa 0,1 on the 1.4B models; GPU serving at concurrency 1..16; the 48-layer MoE bench where the
# card has the memory for it (the K-quant experts' f16 copies: ~75 GB). Everything into $OUT/2b.tgz.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/2b; K=$G/kernels/sm_90; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/2b.tgz -C $OUT 2b; }
trap finish EXIT
bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"
for q in q8_0 q4_k; do
  M=/tmp/s8/m-$q.gguf
  common=(bench -m $M --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json)
  stamp "civetta $q: timing off, 5%, off"
  $G/civetta "${common[@]}" --kernel-timing off > $O/civ-$q-off.json 2>> $O/bench.err
  $G/civetta "${common[@]}" --kernel-timing on --sample-rate 0.05 > $O/civ-$q-on5.json 2>> $O/bench.err
  stamp "llama-bench $q -fa 0,1"
  /tmp/llama.cpp/build/bin/llama-bench -m $M -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > $O/llama-$q.json 2> $O/llama-$q.err || tail -3 $O/llama-$q.err
done
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
def L(p):
    try: return json.load(open(os.path.join(o, p)))
    except Exception: return None
print("| model | test | civetta off | off (again) | on 5% | llama fa0 | llama fa1 | ratio fa0 | ratio fa1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for q in ("q8_0", "q4_k"):
    off, off2, on5, ll = L(f"civ-{q}-off.json"), L(f"civ-{q}-off2.json"), L(f"civ-{q}-on5.json"), L(f"llama-{q}.json")
    for t in (off or {}).get("tests", []):
        n = int(t["name"][2:]); kind = t["kind"]
        def lt(fa):
            for r in ll or []:
                if r.get("flash_attn") in (fa, bool(fa)) and ((kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0) or (kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)): return r["avg_ts"]
        g = lambda d: next((x["mean_tps"] for x in (d or {}).get("tests", []) if x["name"] == t["name"]), 0)
        l0, l1 = lt(0) or 0, lt(1) or 0
        best = max(t["mean_tps"], g(off2))
        print(f"| {q} | {t['name']} | {t['mean_tps']:.1f} | {g(off2):.1f} | {g(on5):.1f} | {l0:.1f} | {l1:.1f} | {best/l0 if l0 else 0:.3f} | {best/l1 if l1 else 0:.3f} |")
PY
stamp "serving: 1.4B Q8_0 daemon, civetta bench --remote at concurrency 1..16"
CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
  setsid $G/civetta serve -m /tmp/s8/m-q8_0.gguf --grpc-addr 127.0.0.1:50081 --metrics-addr 127.0.0.1:9581 > $O/serve.log 2>&1 < /dev/null &
sp=$!
for _ in $(seq 120); do grep -q listening $O/serve.log && break; sleep 1; done
timeout 70 $G/civetta bench --remote 127.0.0.1:50081 --concurrency 1,2,4,8,16 --requests 16 -n 64 -q -o md > $O/serving.md 2> $O/serving.err; cat $O/serving.md | head -20
curl -s 127.0.0.1:9581/metrics | grep -E "^civetta_batch_(rows|sequences)_(sum|count)" > $O/batch-metrics.txt
kill $sp
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
L=48; (( mem < 100000 )) && L=24
stamp "MoE bench (scripts/gpu-moe.sh bench llama, $L layers)"
OUT=$O LAYERS=$L REPS=2 timeout 170 bash $G/15/run.sh bench llama 2>&1 | tail -12
stamp done
