#!/usr/bin/env bash
# Batched decode on an NVIDIA machine (issue #17 / #14's GPU target; docs/GPU.md, "Batched decode"):
# one device call, about 6-7 minutes on the H200. Written in session 4, when no device was lent:
# it has NOT run yet.
#   1. parity: gpu_check (all synthetic models, defaults), then batch vs alone on the 1.4B models
#      with the opt-in paths (batch_decode_bench: 1..32 sequences, the first and last sequence
#      re-run alone with the same tokens; relative L2 of their final logits);
#   2. step time per batch size, before (defaults: GEMM tiles above 4 rows, two attention
#      launches per sequence and layer) and after (--matvec-max-rows 32 --batched-attention),
#      with a per-kernel profile of the after case;
#   3. matvec_bench rows 1..32 (dp4a builds vs the GEMM path, CPU reference per matrix);
#   4. serving: aggregate tokens/s at concurrency 1..16 from a separate client process, before
#      and after (engine.gpu.matvec_max_rows / engine.gpu.batched_attention by environment);
#   5. civetta bench pp512/pp2048/tg128 (also with --gpu-gemm-tile 64x64: the prefill tile's
#      occupancy), and, when .gpu/llama/wait.sh is there (the lead's
#      llama.cpp CUDA build, FA kernels compiled), llama-bench -fa 0,1 on the same files;
#   6. summary.json as scripts/gpu-check.sh writes it, plus the serving ratios.
# Needs the folder of `scripts/gpu-check.sh prepare` (civetta, gpu_check, matvec_bench,
# batch_decode_bench built with --features cuda, kernels/sm_90/*.ptx).
# env: GPU_DIR (.gpu), OUT (build/gpu-batch), LIMIT_S (470: llama-bench is skipped past it).
set -uo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_DIR:-.gpu}
O=${OUT:-build/gpu-batch}
LIMIT_S=${LIMIT_S:-470}
B=$GPU_DIR
K=$GPU_DIR/kernels/sm_90
mkdir -p "$O" /tmp/gpu-batch
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
left() { echo $(( LIMIT_S - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$O/gpu.txt" 2>&1
for f in matvec_dp4a attention kv_cache; do ptxas -arch=sm_90 -v $K/$f.ptx -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
  | sed -E "s/ptxas info *: //g" > "$O/ptxas.txt" 2>&1
M8=/tmp/gpu-batch/m-q8_0.gguf; M4=/tmp/gpu-batch/m-q4_k.gguf
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
stamp "synth (background) + parity (gpu_check, defaults)"
( [[ -f $M8 ]] || $B/civetta model synth $SZ --quant q8_0 -o $M8 > "$O/synth.log" 2>&1
  [[ -f $M4 ]] || $B/civetta model synth $SZ --quant q4_k -o $M4 >> "$O/synth.log" 2>&1 ) & sp=$!
timeout 160 $B/gpu_check --backend cuda --kernel-dir $K > "$O/parity.md" 2> "$O/parity.err"; echo "parity rc=$?"
grep -E "FAIL|DIFFER|all models|error|panick" "$O/parity.md" "$O/parity.err" | head -8
wait $sp
AFTER=(--matvec-max-rows 32 --batched-attention)
BD=($B/batch_decode_bench --kernel-dir $K --batches 1,2,4,8,16,32 --steps 48)
for m in q8_0 q4_k; do
  stamp "batch_decode_bench $m: after (with profile), before"
  prof=(); [[ $m == q8_0 ]] && prof=(--profile)
  timeout 90 "${BD[@]}" -m /tmp/gpu-batch/m-$m.gguf "${AFTER[@]}" "${prof[@]}" > "$O/batch-$m-after.md" 2> "$O/batch-$m-after.err"
  grep "^| [0-9]" "$O/batch-$m-after.md"
  timeout 60 "${BD[@]}" -m /tmp/gpu-batch/m-$m.gguf > "$O/batch-$m-before.md" 2> "$O/batch-$m-before.err"
  grep "^| [0-9]" "$O/batch-$m-before.md"
done
# Batch vs alone on the other shapes: gemma3 (head size 256, sliding-window layers that keep the
# per-sequence attention), qwen2 (biases, Q4_K), qwen3 (q/k norms, Q5_0 on the int8 planes).
for spec in "gemma3 q8_0 --heads 4 --kv-heads 1 --head-dim 256" "qwen2 q4_k" "qwen3 q5_0"; do
  set -- $spec; arch=$1; q=$2; shift 2
  f=/tmp/gpu-batch/small-$arch-$q.gguf
  $B/civetta model synth --arch $arch --quant $q --size small "$@" -o $f > /dev/null 2>> "$O/synth.log"
  stamp "batch vs alone: small $arch $q (after)"
  timeout 40 $B/batch_decode_bench --kernel-dir $K -m $f --batches 1,3,5,9,16,32 --steps 16 --prompt 24 "${AFTER[@]}" \
    > "$O/batch-small-$arch-$q.md" 2> "$O/batch-small-$arch-$q.err"
  grep "^| [0-9]" "$O/batch-small-$arch-$q.md" | awk -F'|' '{print "  seqs" $2 "batch vs alone" $6}'
done
stamp "batch_decode_bench q8_0: mat-vec to 32 rows, attention per sequence (the two changes apart)"
timeout 60 "${BD[@]}" -m $M8 --matvec-max-rows 32 > "$O/batch-q8_0-matvec-only.md" 2> "$O/batch-q8_0-matvec-only.err"
grep "^| [0-9]" "$O/batch-q8_0-matvec-only.md"
for m in q8_0 q4_k; do
  stamp "matvec_bench $m rows 1..32: dp4a builds (--matvec-max-rows 32) vs wave (GEMM above 4 rows)"
  timeout 60 $B/matvec_bench -m /tmp/gpu-batch/m-$m.gguf --kernel-dir $K --rows 1,4,8,16,32 --iters 100 --variants dp4a,wave \
    --matvec-max-rows 32 > "$O/matvec-$m.md" 2> "$O/matvec-$m.err"
  tail -1 "$O/matvec-$m.err"
done
serve() { # $1 name, rest: environment
  local name=$1; shift
  env "$@" CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$K" CIVETTA_ENGINE__MAX_ACTIVE_SEQUENCES=16 \
    CIVETTA_ENGINE__KERNEL_TIMING__ENABLED=false \
    $B/civetta serve -m $M8 --grpc-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 --http-addr "" > "$O/serve-$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 90); do grep -q listening "$O/serve-$name.log" && break; sleep 1; done
  local addr maddr
  addr=$(grep -o "grpc=[0-9.:]*" "$O/serve-$name.log" | head -1 | cut -d= -f2)
  maddr=$(grep -o "metrics=[0-9.:]*" "$O/serve-$name.log" | head -1 | cut -d= -f2)
  timeout 100 $B/civetta bench --remote "$addr" --concurrency 1,2,4,8,16 --requests 32 -n 64 -q -o json > "$O/serving-$name.json" 2> "$O/serving-$name.err" \
    || { echo "BENCH FAILED"; tail -3 "$O/serving-$name.err"; }
  curl -s "$maddr/metrics" | grep -E "^civetta_batch_(rows|sequences)_(sum|count)" > "$O/batch-metrics-$name.txt" || true
  kill $pid; wait $pid 2>/dev/null
}
stamp "serving q8_0, concurrency 1..16: after"
serve after CIVETTA_ENGINE__GPU__MATVEC_MAX_ROWS=32 CIVETTA_ENGINE__GPU__BATCHED_ATTENTION=true
stamp "serving q8_0: before (defaults)"
serve before
BA=(bench --backend cuda --kernel-dir $K -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q -o json --kernel-timing off)
for m in q8_0 q4_k; do
  stamp "civetta bench $m; then with every GEMM on the 64x64 tile (prefill occupancy: 192 vs 48 workgroups at pp512)"
  timeout 60 $B/civetta "${BA[@]}" -m /tmp/gpu-batch/m-$m.gguf > "$O/civetta-$m.json" 2>> "$O/bench.err"
  timeout 60 $B/civetta "${BA[@]}" -m /tmp/gpu-batch/m-$m.gguf --gpu-gemm-tile 64x64 > "$O/civetta-$m-t64.json" 2>> "$O/bench.err"
done
if [[ -f .gpu/llama/wait.sh && $(left) -gt 60 ]]; then
  stamp "waiting for llama.cpp"; timeout $(( $(left) - 50 )) bash .gpu/llama/wait.sh > "$O/llama-wait.log" 2>&1
  LB=/tmp/llama.cpp/build/bin/llama-bench
  for m in q8_0 q4_k; do
    [[ -x $LB && $(left) -gt 25 ]] || { echo "no time or no binary for llama-bench $m"; continue; }
    stamp "llama-bench $m -fa 0,1"
    timeout $(( $(left) - 10 )) $LB -m /tmp/gpu-batch/m-$m.gguf -ngl 99 -p 512,2048 -n 128 -r 3 -fa 0,1 -o json > "$O/llama-$m.json" 2> "$O/llama-$m.log" \
      || tail -3 "$O/llama-$m.log"
  done
else echo "llama.cpp: no .gpu/llama/wait.sh or no time left"; fi
stamp "summary"
python3 - "$O" "$M8" <<'PY'
import json, os, re, sys
o, m8 = sys.argv[1], sys.argv[2]
def load(n):
    try: return json.load(open(os.path.join(o, n)))
    except Exception: return None
serving = {}
for name in ("after", "before"):
    r = load(f"serving-{name}.json")
    if not r: print("serving", name, "no result"); continue
    levels = r.get("remote", [])
    base = levels[0]["tokens_per_second"] if levels else None
    serving[name] = [{"concurrency": x["concurrency"], "tokens_per_second": round(x["tokens_per_second"], 1),
                      "vs_c1": round(x["tokens_per_second"] / base, 2) if base else None, "errors": x["errors"]} for x in levels]
    for x in levels:
        print(f"serving {name} c{x['concurrency']}: {x['tokens_per_second']:.1f} t/s ({x['tokens_per_second'] / base:.2f}x of c1), "
              f"TTFT p50 {x['ttft_p50_s'] * 1e3:.1f} ms, ITL p50 {x['itl_p50_s'] * 1e3:.2f} ms p99 {x['itl_p99_s'] * 1e3:.2f} ms, errors {x['errors']}")
copy = None
try: copy = float(re.search(r"copy bandwidth ([0-9.]+) GB/s", open(os.path.join(o, "matvec-q8_0.md")).read()).group(1))
except Exception: pass
tests = []
for m in ("q8_0", "q4_k"):
    c = load(f"civetta-{m}.json"); ll = load(f"llama-{m}.json") or []
    if not c: continue
    for t in c["tests"]:
        n = int(t["name"][2:])
        def pick(fa):
            for r in ll:
                if bool(r.get("flash_attn")) == fa and ((t["kind"] == "pp" and r["n_prompt"] == n and r["n_gen"] == 0)
                                                        or (t["kind"] == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)):
                    return r["avg_ts"]
        l0, l1 = pick(False), pick(True)
        tests.append({"model": m, "test": t["name"], "civetta": round(t["mean_tps"], 1),
                      "llama_cpp": round(l0, 1) if l0 else None, "ratio": round(t["mean_tps"] / l0, 3) if l0 else None,
                      "llama_cpp_fa": round(l1, 1) if l1 else None, "ratio_fa": round(t["mean_tps"] / l1, 3) if l1 else None})
        print(tests[-1])
for m in ("q8_0", "q4_k"):
    a, b = load(f"civetta-{m}.json"), load(f"civetta-{m}-t64.json")
    if a and b:
        print(m, "GEMM tile auto vs 64x64:", ", ".join(f"{x['name']} {x['mean_tps']:.0f} / {y['mean_tps']:.0f}" for x, y in zip(a["tests"], b["tests"])))
tg = [t for t in tests if t["model"] == "q8_0" and t["test"] == "tg128"]
roof = round(tg[0]["civetta"] / (copy * 1e9 / os.path.getsize(m8)), 3) if tg and copy and os.path.exists(m8) else None
json.dump({"tests": tests, "roofline_fraction": roof, "copy_bandwidth_gbs": copy, "serving_q8_0": serving},
          open(os.path.join(o, "summary.json"), "w"), indent=1)
print("roofline_fraction", roof)
PY
grep -h "| 1 |\|| 8 |\|| 16 |" "$O"/matvec-*.md | grep -E "ffn_gate|ffn_down|output" | awk -F'|' '{print $2,$5,$6,$7,$8,$9,$12}' | head -40
grep -E "_x16|batch" "$O/ptxas.txt" | cut -c1-160 | head -12
stamp "done"
