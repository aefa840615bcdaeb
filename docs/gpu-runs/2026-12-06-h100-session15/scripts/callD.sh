#!/usr/bin/env bash
# Session 15, call D (fresh): an 8-layer Qwen3-30B-A3B-shaped MoE Q4_K (vocab 151,936), civetta
# before / after interleaved and llama-bench -fa 0,1 on the same file, after the llama.cpp build
# (nothing timed while it builds). Into $OUT/d.tgz.
set -uo pipefail
source .gpu/15/common.sh
O=$OUT/d; mkdir -p $O
finish() { tar czf $OUT/d.tgz -C $OUT d; }
trap finish EXIT
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
JOBS=16 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null &
M=$W/q3moe-8l-q4_k.gguf
[[ -s $M ]] || $W/civetta-after model synth --arch qwen3moe --quant q4_k --size 1b --layers 8 --dim 2048 --heads 32 --kv-heads 4 \
  --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o $M > $O/synth.log 2>&1
stamp "synth done"; ls -la $M
timeout 280 bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"; tail -1 $O/llama-wait.log
civ() { local b=$1 K=$KA; [[ $b == before ]] && K=$KB
  $W/civetta-$b bench -m $M --backend cuda --kernel-dir $K -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off > $O/civ-moe-$b-$2.json 2>> $O/bench.err; }
for r in 1 2; do order="before after"; (( r == 2 )) && order="after before"; for b in $order; do stamp "civetta $b r$r"; civ $b r$r; done; done
stamp "llama-bench -fa 0,1"
/tmp/llama.cpp/build/bin/llama-bench -m $M -ngl 99 -p 512 -n 128 -r 3 -fa 0,1 -o json > $O/llama-moe.json 2> $O/llama-moe.err || tail -3 $O/llama-moe.err
python3 - $O <<'PY' | tee $O/summary.md
import json, glob, os, statistics, sys
o = sys.argv[1]
def L(p):
    try: return json.load(open(p))
    except Exception: return None
for test in ("pp512", "tg128"):
    row = {}
    for b in ("before", "after"):
        v = [t["mean_tps"] for p in sorted(glob.glob(f"{o}/civ-moe-{b}-r*.json")) if L(p) for t in L(p)["tests"] if t["name"] == test]
        row[b] = (statistics.median(v) if v else 0, v)
    ll = {}
    for r in L(f"{o}/llama-moe.json") or []:
        kind = "pp" if r["n_gen"] == 0 else "tg"
        if kind == test[:2]: ll[int(bool(r["flash_attn"]))] = (r["avg_ts"], [round(x) for x in r["samples_ts"]])
    a = row["after"][0]
    print(test, "before", row["before"], "after", row["after"], "llama fa0/fa1", ll, "after/before %.3f" % (a / row["before"][0] if row["before"][0] else 0),
          "after/fa0 %.3f after/fa1 %.3f" % tuple(a / ll[k][0] if k in ll and ll[k][0] else 0 for k in (0, 1)))
PY
stamp done
