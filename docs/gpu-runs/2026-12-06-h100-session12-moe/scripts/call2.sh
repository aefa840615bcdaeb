#!/usr/bin/env bash
# Session 12, device call 2: the MoE bench (device routing, host routing, 5% profile) on the 24-layer
# Qwen3-30B-A3B-shaped Q4_K file, llama-bench -fa 0,1 on the same file once built.
set -uo pipefail
G=$PWD/.gpu; O=$OUT/c2; mkdir -p $O /tmp/g15
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; ls -la /tmp/g15/ 2>&1 | tail -4
[[ -f /tmp/llama.cpp/build.rc || -d /tmp/llama.cpp/build ]] || { JOBS=10 setsid bash $G/llama/build.sh > /dev/null 2>&1 < /dev/null & }
[[ -x /tmp/g15/civetta ]] || { xz -dc $G/15/civetta.xz > /tmp/g15/civetta && chmod +x /tmp/g15/civetta; }
K=$G/15/kernels/sm_90
M=/tmp/g15/q3moe-24l.gguf
[[ -s $M ]] || { [[ -s /tmp/g15/tmp.gguf ]] && ! pgrep -f "model synth" > /dev/null && mv /tmp/g15/tmp.gguf $M; }
[[ -s $M ]] || { pgrep -f "model synth" > /dev/null || /tmp/g15/civetta model synth --arch qwen3moe --quant q4_k --size 1b --layers 24 --dim 2048 --heads 32 --kv-heads 4 --head-dim 128 \
   --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o /tmp/g15/tmp.gguf && mv /tmp/g15/tmp.gguf $M; }
timeout 300 bash -c "until [[ -s $M ]]; do sleep 2; done"; ls -la $M
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
stamp "bench device routing"
timeout 120 /tmp/g15/civetta "${BA[@]}" > $O/civetta.json 2> $O/civetta.err; echo rc=$?
stamp "bench host routing"
timeout 120 /tmp/g15/civetta "${BA[@]}" --gpu-moe-device-routing false > $O/civetta-host.json 2>> $O/civetta.err; echo rc=$?
python3 - $O <<'PY'
import json, sys, os
o = sys.argv[1]
for f in ("civetta.json", "civetta-host.json"):
    try:
        d = json.load(open(os.path.join(o, f)))
        print(f, [(t["name"], round(t["mean_tps"], 1), [round(x, 1) for x in t.get("samples_tps", [])]) for t in d["tests"]], {k: v for k, v in d.items() if "hash" in k})
    except Exception as e: print(f, "missing", e)
PY
tail -3 $O/civetta.err
stamp "llama build"; bash $G/llama/wait.sh; echo "llama rc=$?"
for fa in 0 1; do
  stamp "llama-bench -fa $fa"
  timeout 100 /tmp/llama.cpp/build/bin/llama-bench -m $M -p 512 -n 128 -r 3 -ngl 99 -fa $fa -o json > $O/llama-fa$fa.json 2> $O/llama-fa$fa.err || tail -3 $O/llama-fa$fa.err
  python3 -c "import json,sys; [print(r['n_prompt'], r['n_gen'], round(r['avg_ts'],1), [round(x,1) for x in r['samples_ts']]) for r in json.load(open('$O/llama-fa$fa.json'))]" 2>&1 | tail -3
done
stamp "profile 5% device routing"
timeout 100 /tmp/g15/civetta bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 64 -r 1 --prefill-batch 512 -q -o json --kernel-timing on --sample-rate 0.05 > $O/civetta-profile.json 2>> $O/civetta.err; echo rc=$?
stamp done
