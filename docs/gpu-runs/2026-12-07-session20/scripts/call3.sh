#!/usr/bin/env bash
# Session 19, call 3 (#17): tg128 with every replay timed (rate 1): stamps vs events vs off, three rounds.
# against event nodes, on the 1.4B Q8_0 model of scripts/gpu-check.sh. S = main + stamps.
# 1) greedy hashes with every replay timed (rate 1) by stamps, by events, and untimed: must match;
# 2) tg128/pp512 at timing off, 5% stamps, 5% events, two interleaved rounds;
# 3) per-kernel decode times from stamps vs events (profile of the 5% runs).
set -uo pipefail
G=$PWD/.gpu/19; W=/tmp/s19; mkdir -p $W; O=$OUT/c3; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/c3.tgz -C $OUT c3; }
trap finish EXIT
[[ -x $W/civ ]] || { xz -dc $G/civetta-S.xz > $W/civ && chmod +x $W/civ; }
K=$G/kernels
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > $O/gpu.txt 2>&1; cat $O/gpu.txt
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/m-q8_0.gguf ]] || $W/civ model synth $SZ --quant q8_0 -o $W/m-q8_0.gguf > /dev/null
stamp "model ready"
run() { # TAG [args]
  local tag=$1; shift
  CIVETTA_LOG=civetta::backend::gpu=debug timeout 150 $W/civ bench -m $W/m-q8_0.gguf --backend cuda --kernel-dir $K --prefill-batch 2048 -q -o json "$@" > $O/$tag.json 2> $O/$tag.err
  printf "%-12s rc=%s %s | timed-captures %s stamps %s\n" $tag $? \
    "$(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']), (d.get('hashes') or {}).get('overall_sha256','')[:16])" $O/$tag.json 2>&1 | tail -1)" \
    "$(grep -c 'timed graph captured' $O/$tag.err)" "$(grep -c 'stamps=true' $O/$tag.err)"
}
B="-p 0 -n 128 -r 5 --hash-tokens 0"
for r in 1 2 3; do
  run off-$r $B --kernel-timing off
  run stamps100-$r $B --kernel-timing on --sample-rate 1 --gpu-timing-stamps true
  run events100-$r $B --kernel-timing on --sample-rate 1 --gpu-timing-stamps false
  finish
done
stamp "speed done"
python3 - $O <<'PY'
import json, sys, statistics as st, glob
O = sys.argv[1]
def med(tag, test):
    v = [st.median(t['samples_tps']) for f in sorted(glob.glob(f"{O}/{tag}-*.json")) for t in json.load(open(f))['tests'] if t['name'] == test]
    return st.median(v) if v else float('nan'), v
for test in ("tg128",):
    off = med('off', test)
    for tag in ('stamps100', 'events100'):
        m = med(tag, test)
        print(f"{test} {tag}: {m[0]:.1f} vs off {off[0]:.1f} t/s -> cost {100*(1-m[0]/off[0]):.2f}%  rounds {m[1]} off {off[1]}")
for tag in ('stamps100-1', 'events100-1'):
    k = [x for x in json.load(open(f"{O}/{tag}.json"))['profile']['kernels'] if x['shape_class'] == 'm1' and x['per_call_seconds']]
    tot = sum(x['total_seconds'] for x in k)
    print(tag, 'm1 kernels:', ' '.join(f"{x['kernel']}={x['per_call_seconds']*1e6:.2f}us" for x in sorted(k, key=lambda x: -x['total_seconds'])[:8]), f'total {tot:.3f}s')
PY
stamp done
