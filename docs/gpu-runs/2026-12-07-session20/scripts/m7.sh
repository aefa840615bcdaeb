#!/usr/bin/env bash
# Session 20, call m7 (#14): where a serving step's host time goes: the committed build serving the
# Q8_0 model at c1 and c16 with the engine's per-step trace (forward time incl. the logits download,
# and the gaps between steps: sampling, emitting, admission).
set -uo pipefail
G=$PWD/.gpu/20; W=/tmp/s20; mkdir -p $W; O=$OUT/m7; mkdir -p $O
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
finish() { tar czf $OUT/m7.tgz -C $OUT m7; }
trap finish EXIT
for b in civetta; do rm -f $W/$b; xz -dc $G/$b.xz > $W/$b && chmod +x $W/$b; done
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
[[ -s $W/dense.gguf ]] || $W/civetta model synth $SZ --quant q8_0 -o $W/dense.gguf > /dev/null
for c in 1 16; do
  env CIVETTA_LOG=info,civetta::engine::scheduler=trace CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR=$G/kernels \
    CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $W/civetta serve -m $W/dense.gguf --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > $O/serve-c$c.log 2>&1 &
  pid=$!
  for _ in $(seq 120); do grep -q listening $O/serve-c$c.log && break; sleep 1; done
  addr=$(grep -o "grpc=[0-9.:]*" $O/serve-c$c.log | head -1 | cut -d= -f2)
  timeout 120 $W/civetta bench --remote "$addr" --concurrency $c --requests 32 -n 64 -q -o json > $O/serving-c$c.json 2> $O/serving-c$c.err
  kill $pid; wait $pid 2>/dev/null
  python3 - $O/serve-c$c.log $O/serving-c$c.json <<'PY'
import sys, re, json, datetime, statistics as st
steps = []
for line in open(sys.argv[1]):
    if ' step ' not in line and not line.rstrip().endswith('step'): pass
    m = re.match(r'(\S+)\s+TRACE.*rows=(\d+).*measured_ms=([0-9.]+)', line)
    if m:
        t = datetime.datetime.fromisoformat(m.group(1).replace('Z', '+00:00')).timestamp()
        steps.append((t, int(m.group(2)), float(m.group(3))))
d = json.load(open(sys.argv[2]))['remote'][0]
print(f"{sys.argv[1]}: {len(steps)} steps, {d['tokens_per_second']:.1f} t/s")
by = {}
for (t, r, ms), (t2, _, ms2) in zip(steps, steps[1:]):
    gap = (t2 - t) * 1e3 - ms2  # log time is at the step's end: gap = interval - the next step's forward
    by.setdefault(r, []).append((ms, gap))
for r in sorted(by, key=lambda r: -len(by[r]))[:6]:
    v = by[r]
    print(f"  rows {r}: {len(v)} steps, forward median {st.median(x[0] for x in v):.3f} ms, host gap after median {st.median(x[1] for x in v):.3f} ms (p90 {sorted(x[1] for x in v)[int(0.9*len(v))]:.3f})")
PY
done
head -c 600 $O/serve-c16.log | tail -c 300
stamp done
