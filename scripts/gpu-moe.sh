#!/usr/bin/env bash
# Mixture of experts on the CUDA backend (issue #15; docs/GPU.md "Mixture of experts"): parity of
# qwen3moe / qwen2moe against the CPU backend, then a Qwen3-30B-A3B-shaped qwen3moe (Q4_K)
# benchmarked against llama.cpp's CUDA backend on the same file, with decode against the
# bandwidth roofline of the parameters a token reads;
# first run on an H100 on 2026-12-05 (docs/gpu-runs/2026-12-05-h100-session8). The bench step also runs
# the decode with MoE routing on the host (`--gpu-moe-device-routing false`) beside the default device routing.
#
# usage (build machine):  scripts/gpu-moe.sh prepare      -> $GPU_DIR (default .gpu/15): stripped,
#                         xz'd cuda builds of civetta and gpu_check, sm_90 PTX, this script as run.sh
#        (GPU machine):   bash .gpu/15/run.sh [parity] [bench] [llama]      (default: all three)
# env:   OUT (results go to $OUT/15), LAYERS (bench model layers, default 48: ~17 GB, synthesised
#        here on the CPU; the time is printed: 8 is the CPU benchmark's file), REPS (default 3).
# llama.cpp: the lead's .gpu/llama/build.sh builds llama-bench in the background of the same call
# (FA kernels compiled); `bash .gpu/llama/wait.sh` blocks until it is there.
set -uo pipefail

if [[ "${1:-}" == prepare ]]; then
  set -e
  cd "$(dirname "$0")/.."
  GPU_DIR=${GPU_DIR:-.gpu/15}
  cargo build --release --features cuda --bin civetta --example gpu_check
  make kernels-ptx CLANG="${CLANG:-clang-22}" CUDA_ARCH=sm_90
  rm -rf "$GPU_DIR" && mkdir -p "$GPU_DIR/kernels"
  cp -r "$(ls -d build/kernels/clang-*/sm_90 | sort -V | tail -1)" "$GPU_DIR/kernels/sm_90"
  for b in civetta examples/gpu_check; do strip -o "$GPU_DIR/$(basename $b)" "target/release/$b" && xz -9 -f "$GPU_DIR/$(basename $b)"; done
  cp scripts/gpu-moe.sh "$GPU_DIR/run.sh" && cp scripts/gpu-copy-bw.cu "$GPU_DIR/"
  # llama.cpp for the `llama` step: .gpu/llama/build.sh and wait.sh with the source tarball
  # (docs/gpu-runs/2026-12-05-h100-session8/scripts/llama-*.sh) are staged by hand.
  du -sh "$GPU_DIR"
  exit 0
fi

D=$(cd "$(dirname "$0")" && pwd)
O=${OUT:-/tmp/gpu-moe-out}/15
LAYERS=${LAYERS:-48}
REPS=${REPS:-3}
mkdir -p "$O" /tmp/g15
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(parity bench llama)
has() { [[ " ${steps[*]} " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }
for b in civetta gpu_check; do xz -dc "$D/$b.xz" > /tmp/g15/$b && chmod +x /tmp/g15/$b; done
CIV=/tmp/g15/civetta
K="$D/kernels/sm_90"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$O/gpu.txt" 2>&1
echo "kernels: $(head -1 "$K/compiler.txt")" | tee -a "$O/gpu.txt"

# The bench model: Qwen3-30B-A3B's per-layer shape (dim 2048, 32/4 heads of 128, 128 experts,
# 8 used, expert ffn 768) and vocabulary size, Q4_K. Synthesised in the background (CPU-bound)
# while the parity check runs.
M=/tmp/g15/q3moe-${LAYERS}l.gguf
SYNTH=(model synth --arch qwen3moe --quant q4_k --size 1b --layers "$LAYERS" --dim 2048 --heads 32 --kv-heads 4 --head-dim 128
  --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 --context 4096 -o "$M")
if has bench || has llama; then
  stamp "synth: civetta ${SYNTH[*]} (background)"
  # A file left by an earlier call on the same warm machine is reused.
  ( s=$(date +%s); [[ -s $M ]] && { echo "reusing $M" > "$O/synth.txt"; exit 0; }
    $CIV "${SYNTH[@]}" > "$O/synth.txt" 2>&1; echo "rc=$? seconds=$(($(date +%s) - s))" >> "$O/synth.txt" ) &
  synth_pid=$!
fi

if has parity; then
  stamp "ptxas (sm_90) of kernels/moe.hip"
  ptxas -arch=sm_90 -v "$K/moe.ptx" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - | sed -E "s/ptxas info *: //g" > "$O/ptxas-moe.txt" || true
  cat "$O/ptxas-moe.txt"
  stamp "parity: MoE (and dense, as a regression check) GPU vs CPU"
  /tmp/g15/gpu_check --backend cuda --kernel-dir "$K" --archs qwen3moe,qwen2moe --quants q8_0,q4_k 2>&1 | tee "$O/parity-moe.md" || echo "MOE PARITY FAILED"
  /tmp/g15/gpu_check --backend cuda --kernel-dir "$K" --archs llama,qwen3 --quants q8_0,q4_k 2>&1 | tee "$O/parity-dense.md" || echo "DENSE PARITY FAILED"
fi

if has bench || has llama; then
  stamp "copy bandwidth (nvcc gpu-copy-bw.cu)"
  nvcc -O2 -o /tmp/g15/copy-bw "$D/gpu-copy-bw.cu" && /tmp/g15/copy-bw | tee "$O/copy-bw.txt"
  stamp "waiting for synth"
  wait $synth_pid
  cat "$O/synth.txt"
  ls -la "$M" | tee -a "$O/synth.txt"
  $CIV info "$M" | head -8 > "$O/info.txt"
fi

if has bench; then
  BA=(bench --backend cuda --gpu-moe --kernel-dir "$K" -m "$M" -p 512 -n 128 -r "$REPS" --prefill-batch 512 --hash-tokens 16 -q -o json)
  stamp "civetta bench (kernel timing off)"
  $CIV "${BA[@]}" --kernel-timing off > "$O/civetta.json" 2> "$O/civetta.err" || { echo "BENCH FAILED"; tail -5 "$O/civetta.err"; }
  stamp "civetta bench, decode routed on the host (--gpu-moe-device-routing false)"
  $CIV "${BA[@]}" --kernel-timing off --gpu-moe-device-routing false > "$O/civetta-host.json" 2>> "$O/civetta.err" || echo "HOST-ROUTING BENCH FAILED"
  stamp "civetta profile (5% of launches timed, 1 repetition)"
  $CIV bench --backend cuda --gpu-moe --kernel-dir "$K" -m "$M" -p 512 -n 32 -r 1 --prefill-batch 512 --hash-tokens 16 -q -o json \
    --kernel-timing on --sample-rate 0.05 > "$O/civetta-profile.json" 2>> "$O/civetta.err" || echo "PROFILE FAILED"
fi

if has llama; then
  stamp "waiting for the llama.cpp CUDA build"
  if bash .gpu/llama/wait.sh; then
    for fa in 0 1; do
      stamp "llama-bench -fa $fa"
      /tmp/llama.cpp/build/bin/llama-bench -m "$M" -p 512 -n 128 -r "$REPS" -ngl 99 -fa $fa -o json > "$O/llama-fa$fa.json" 2> "$O/llama-fa$fa.err" \
        || tail -5 "$O/llama-fa$fa.err"
    done
  fi
fi

# Summary: ratios, and decode against the roofline of the ACTIVE parameters: bytes a decode step
# reads = per layer the attention matrices, the f32 router, 8 of 128 experts' gate/up/down,
# plus the output matrix (Q4_K: 144 bytes per 256 weights; norms ignored).
stamp "summary"
python3 - "$O" "$LAYERS" <<'EOF' | tee "$O/summary.md"
import json, os, re, sys
o, layers = sys.argv[1], int(sys.argv[2])
def load(p):
    try: return json.load(open(os.path.join(o, p)))
    except Exception: return None
q4k = 144 / 256
d, hd, nh, nkv, ne, nu, eff, vocab = 2048, 128, 32, 4, 128, 8, 768, 151936
attn = d * hd * (nh + 2 * nkv) + nh * hd * d
per_layer = attn * q4k + ne * d * 4 + nu * 3 * eff * d * q4k
active = layers * per_layer + vocab * d * q4k
bw = re.search(r"copy_gbs ([0-9.]+)", open(os.path.join(o, "copy-bw.txt")).read()) if os.path.exists(os.path.join(o, "copy-bw.txt")) else None
bound = float(bw.group(1)) * 1e9 / active if bw else None
civ, host = load("civetta.json"), load("civetta-host.json")
lla = {fa: load(f"llama-fa{fa}.json") for fa in (0, 1)}
def ll(rows, kind):
    for r in rows or []:
        if kind == "pp" and r["n_gen"] == 0: return r["avg_ts"]
        if kind == "tg" and r["n_prompt"] == 0: return r["avg_ts"]
print(f"model: qwen3moe {layers} layers Q4_K; active bytes per decode token {active / 1e9:.3f} GB;"
      f" copy bandwidth {bw.group(1) if bw else '?'} GB/s; roofline {bound or 0:.0f} t/s")
print("| test | civetta cuda | civetta, host routing | llama.cpp fa0 | llama.cpp fa1 | civetta / llama.cpp (best) | of roofline |")
print("|---|---:|---:|---:|---:|---:|---:|")
for t in (civ or {}).get("tests", []):
    k = t["kind"]; e = next((x["mean_tps"] for x in (host or {}).get("tests", []) if x["name"] == t["name"]), None)
    l0, l1 = ll(lla[0], k), ll(lla[1], k)
    best = max([x for x in (l0, l1) if x] or [0])
    roof = f"{t['mean_tps'] / bound:.3f}" if k == "tg" and bound else "-"
    print(f"| {t['name']} | {t['mean_tps']:.1f} | {e or 0:.1f} | {l0 or 0:.1f} | {l1 or 0:.1f} | {t['mean_tps'] / best if best else 0:.2f}x | {roof} |")
for fa in (0, 1):
    tg = ll(lla[fa], "tg")
    if tg and bound: print(f"llama.cpp fa{fa} tg of roofline: {tg / bound:.3f}")
EOF
stamp "done"
