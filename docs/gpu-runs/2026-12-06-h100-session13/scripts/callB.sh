#!/usr/bin/env bash
# Session 13, device call B (same warm machine): llama-bench -fa 0/1 on the 48-layer file, civetta
# bench again after them (interleaved order: civetta, llama fa0, llama fa1, civetta).
set -uo pipefail
G=$PWD/.gpu; O=$OUT/B; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
K=$G/13/kernels/sm_90; CIV=/tmp/g13/civetta; M=/tmp/g13/q3moe-48l.gguf; ls -la $M
nvcc -O2 -o /tmp/g13/copy-bw $G/13/gpu-copy-bw.cu 2>/dev/null && /tmp/g13/copy-bw | tee $O/copy-bw.txt
stamp "llama build"; bash $G/llama/wait.sh; echo "llama rc=$?"
for fa in 0 1; do
  stamp "llama-bench -fa $fa"
  timeout 150 /tmp/llama.cpp/build/bin/llama-bench -m $M -p 512 -n 128 -r 3 -ngl 99 -fa $fa -o json > $O/llama-fa$fa.json 2> $O/llama-fa$fa.err || tail -3 $O/llama-fa$fa.err
  python3 -c "import json,sys; [print(r['n_prompt'], r['n_gen'], round(r['avg_ts'],1), [round(x,1) for x in r['samples_ts']]) for r in json.load(open('$O/llama-fa$fa.json'))]" 2>&1 | tail -3
done
BA=(bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 128 -r 3 --prefill-batch 512 --hash-tokens 16 -q -o json --kernel-timing off)
stamp "civetta bench 48 layers (second)"
timeout 200 $CIV "${BA[@]}" > $O/civetta48.json 2> $O/civetta48.err; echo rc=$?
python3 -c "import json; d=json.load(open('$O/civetta48.json')); print([(t['name'], round(t['mean_tps'],1), [round(x,1) for x in t.get('samples_tps',[])]) for t in d['tests']], d['hashes'].get('overall_sha256','')[:16])" 2>&1 | tail -1
stamp "profile 5%"
timeout 150 $CIV bench --backend cuda --kernel-dir "$K" -m "$M" -p 512 -n 64 -r 1 --prefill-batch 512 -q -o json --kernel-timing on --sample-rate 0.05 > $O/civetta-profile.json 2>> $O/civetta48.err; echo rc=$?
stamp done
