#!/usr/bin/env bash
# Session 15, call B (warm, right after callA.sh): civetta after vs llama-bench -fa 0,1 on the same
# 1.4B Q8_0 / Q4_K files, interleaved (civetta, llama, civetta). Into $OUT/b.tgz.
set -uo pipefail
source .gpu/15/common.sh
O=$OUT/b; mkdir -p $O
finish() { tar czf $OUT/b.tgz -C $OUT b; }
trap finish EXIT
timeout 300 bash $G/llama/wait.sh > $O/llama-wait.log 2>&1; echo "llama rc=$?"; tail -3 $O/llama-wait.log
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
civ() { $W/civetta-after bench -m $W/m-$1.gguf --backend cuda --kernel-dir $KA -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing off > $O/civ-$1-after-$2.json 2>> $O/bench.err; }
for q in q8_0 q4_k; do
  stamp "civetta $q (1)"; civ $q r1
  stamp "llama-bench $q -fa 0,1"
  /tmp/llama.cpp/build/bin/llama-bench -m $W/m-$q.gguf -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > $O/llama-$q.json 2> $O/llama-$q.err || tail -3 $O/llama-$q.err
  stamp "civetta $q (2)"; civ $q r2
done
python3 - $O <<'PY' | tee $O/summary.md
import json, os, statistics, sys
o = sys.argv[1]
def L(p):
    try: return json.load(open(os.path.join(o, p)))
    except Exception: return None
summary = {"tests": []}
print("| model | test | civetta (2 runs) | llama.cpp fa0 | fa1 | civetta / fa0 | civetta / fa1 |")
print("|---|---|---|---:|---:|---:|---:|")
for q in ("q8_0", "q4_k"):
    runs = [L(f"civ-{q}-after-r{i}.json") for i in (1, 2)]
    for test in ("pp512", "pp2048", "tg128"):
        v = [t["mean_tps"] for r in runs if r for t in r["tests"] if t["name"] == test]
        c = statistics.median(v) if v else 0
        kind, n = test[:2], int(test[2:])
        def ll(fa):
            for r in L(f"llama-{q}.json") or []:
                if r.get("flash_attn") in (fa, bool(fa)) and ((kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0) or (kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)):
                    return r["avg_ts"]
            return 0
        l0, l1 = ll(0), ll(1)
        print(f"| {q} | {test} | {c:.1f} ({' / '.join(f'{x:.1f}' for x in v)}) | {l0:.1f} | {l1:.1f} | {c/l0 if l0 else 0:.3f} | {c/l1 if l1 else 0:.3f} |")
        for fa, l in ((0, l0), (1, l1)):
            summary["tests"].append({"model": f"1.4B {q}", "test": test, "civetta": c, "llama_cpp": l, "llama_cpp_flash_attn": fa, "ratio": c / l if l else None})
json.dump(summary, open(os.path.join(o, "summary.json"), "w"), indent=1)
PY
stamp done
