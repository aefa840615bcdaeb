#!/usr/bin/env bash
# GPU verification run (docs/GPU.md): parity with the CPU backend, speed against llama.cpp's
# CUDA backend on the same GGUF file, and per-kernel metrics from a real daemon.
#
# Runs on an NVIDIA machine without network or Rust: everything it needs comes prepared in
# a folder (default .gpu/) made on the build machine by `scripts/gpu-check.sh prepare`:
#   civetta, gpu_check, stream_client, matvec_bench, batch_decode_bench   release builds with --features cuda, stripped
#   kernels/sm_90/*.ptx                  `make kernels-ptx` (clang-22 -x cuda)
#   llama.cpp-src.tar.xz                 llama.cpp from the llama-cpp-python 0.3.36 sdist
#
# usage: scripts/gpu-check.sh prepare             (build machine)
#        scripts/gpu-check.sh [parity] [bench] [metrics] [llama]   (GPU machine; default: all)
# env:   GPU_DIR (.gpu), OUT (where logs and JSON go, default build/gpu-check),
#        BENCH_ARGS (civetta model synth size flags for the bench model)
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DIR=${GPU_DIR:-.gpu}
OUT=${OUT:-build/gpu-check}
BENCH_MODEL_ARGS=${BENCH_ARGS:---arch llama --quant q8_0 --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192}

if [[ "${1:-}" == prepare ]]; then
  cargo build --release --features cuda --bin civetta --example gpu_check --example stream_client --example matvec_bench --example batch_decode_bench
  make kernels-ptx CLANG="${CLANG:-clang-22}" CUDA_ARCH=sm_90
  rm -rf "$GPU_DIR/kernels" && mkdir -p "$GPU_DIR/kernels"
  ptx_dir=$(ls -d build/kernels/clang-*/sm_90 | sort -V | tail -1)
  cp -r "$ptx_dir" "$GPU_DIR/kernels/sm_90"
  for b in civetta examples/gpu_check examples/stream_client examples/matvec_bench examples/batch_decode_bench; do strip -o "$GPU_DIR/$(basename $b)" "target/release/$b"; done
  src=build/llama.cpp/src
  [[ -d $src ]] || scripts/llama-cpp-reference.sh build
  tmp=$(mktemp -d)
  mkdir -p "$tmp/llama.cpp"
  (cd $src && tar cf - CMakeLists.txt cmake common include src vendor licenses LICENSE tools/llama-bench tools/mtmd app ggml) | (cd "$tmp/llama.cpp" && tar xf -)
  printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' > "$tmp/llama.cpp/tools/CMakeLists.txt"
  touch "$tmp/llama.cpp/ggml/ggml.pc.in"
  tar cJf "$GPU_DIR/llama.cpp-src.tar.xz" -C "$tmp" llama.cpp
  rm -rf "$tmp"
  du -sh "$GPU_DIR"
  exit 0
fi

steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(parity llama bench metrics)
has() { [[ " ${steps[*]} " == *" $1 "* ]]; }
mkdir -p "$OUT"
CIV="$GPU_DIR/civetta"
KDIR="$GPU_DIR/kernels/sm_90"
export RUST_BACKTRACE=0
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
echo "kernels: $(head -1 "$KDIR/compiler.txt")"

# llama.cpp's CUDA build takes minutes: start it first, in the background.
LLAMA_DIR=/tmp/llama.cpp
if has llama; then
  stamp "llama.cpp: building (CUDA, sm_90, -DGGML_CUDA_FA=OFF) in the background"
  rm -rf $LLAMA_DIR && tar xJf "$GPU_DIR/llama.cpp-src.tar.xz" -C /tmp
  ( cd $LLAMA_DIR && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_CUDA_FA=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF > "$OUT/llama-cmake.log" 2>&1 \
    && cmake --build build --target llama-bench -j 14 > "$OUT/llama-build.log" 2>&1; echo $? > "$OUT/llama-build.rc" ) &
  llama_pid=$!
fi

if has parity; then
  stamp "ptxas resource report (sm_90)"
  for f in "$KDIR"/*.ptx; do ptxas -arch=sm_90 -v "$f" -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill" | paste - - - ; done \
    | sed -E "s/ptxas info *: //g" > "$OUT/ptxas.txt" || true
  cat "$OUT/ptxas.txt"
  stamp "parity: GPU vs CPU on synthetic models"
  "$GPU_DIR/gpu_check" --backend cuda --kernel-dir "$KDIR" 2>&1 | tee "$OUT/parity.md" || echo "PARITY FAILED"
fi

BENCH_MODEL=/tmp/bench-model.gguf
if has bench || has llama || has metrics; then
  [[ -f $BENCH_MODEL ]] || { stamp "synthesising the bench model: $BENCH_MODEL_ARGS"; "$CIV" model synth $BENCH_MODEL_ARGS -o $BENCH_MODEL; }
  ls -la $BENCH_MODEL
fi

if has bench; then
  stamp "copy bandwidth (device to device, torch)"
  python3 - <<'EOF' 2>&1 | tee "$OUT/bandwidth.txt" || true
import torch
x = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
ts = []
for _ in range(10):
    s.record(); y.copy_(x); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
ts.sort(); t = ts[len(ts) // 2]
print(f"copy bandwidth: {2 * x.numel() / t / 1e9:.0f} GB/s (read + write, median of 10 copies of 2 GiB)")
EOF
  common=(bench -m $BENCH_MODEL --backend cuda --kernel-dir "$KDIR" -p 512,2048 -n 128 -r 3 --prefill-batch 2048 --hash-tokens 16 -q)
  stamp "civetta bench, kernel timing off"
  "$CIV" "${common[@]}" --kernel-timing off -o json > "$OUT/civetta-off.json" || echo "BENCH FAILED"
  stamp "civetta bench, kernel timing on (every launch)"
  "$CIV" "${common[@]}" --kernel-timing on --sample-rate 1 -o json > "$OUT/civetta-on.json" || echo "BENCH FAILED"
  stamp "civetta bench, kernel timing on (5% of launches)"
  "$CIV" "${common[@]}" --kernel-timing on --sample-rate 0.05 -o json > "$OUT/civetta-on5.json" || echo "BENCH FAILED"
  python3 - "$OUT/civetta-off.json" "$OUT/civetta-on.json" "$OUT/civetta-on5.json" <<'EOF' || true
import json, sys
off, on, on5 = (json.load(open(p)) for p in sys.argv[1:4])
print("| test | timing off t/s | on, every launch | ratio | on, 5% sampled | ratio |\n|---|---:|---:|---:|---:|---:|")
for a, b, c in zip(off["tests"], on["tests"], on5["tests"]):
    print(f"| {a['name']} | {a['mean_tps']:.1f} | {b['mean_tps']:.1f} | {b['mean_tps'] / a['mean_tps']:.3f} | {c['mean_tps']:.1f} | {c['mean_tps'] / a['mean_tps']:.3f} |")
print("\nper-kernel (timing on):")
for k in sorted(on["profile"]["kernels"], key=lambda k: -k.get("total_seconds", 0))[:16]:
    print({x: k[x] for x in k if x in ("kernel", "shape_class", "calls", "mean_seconds", "total_seconds")})
EOF
  if [[ -x "$GPU_DIR/matvec_bench" ]]; then
    stamp "decode mat-vec bandwidth per matrix: dp4a (default) vs wave (matvec_bench)"
    "$GPU_DIR/matvec_bench" -m $BENCH_MODEL --kernel-dir "$KDIR" --rows 1,4 --iters 100 --variants dp4a,wave > "$OUT/matvec.md" 2>&1 \
      || echo "MATVEC_BENCH FAILED"
    grep -E "copy bandwidth|\| 1 \|" "$OUT/matvec.md" | head -20
  fi
  true
fi

if has metrics; then
  stamp "daemon on the GPU: one chat completion, then /metrics"
  CIVETTA_ENGINE__BACKEND=cuda CIVETTA_ENGINE__GPU__KERNEL_DIR="$KDIR" "$CIV" serve -m $BENCH_MODEL \
    --grpc-addr 127.0.0.1:50071 --metrics-addr 127.0.0.1:9571 > "$OUT/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 60); do curl -sf http://127.0.0.1:9571/metrics > /dev/null 2>&1 && break; sleep 1; done
  "$GPU_DIR/stream_client" --addr http://127.0.0.1:50071 --prompt "The capital of France is" --max-tokens 32 > "$OUT/stream.txt" 2>&1 || cat "$OUT/stream.txt"
  curl -s http://127.0.0.1:9571/metrics > "$OUT/metrics.txt" || true
  kill $serve_pid; wait $serve_pid || true
  grep -E '^civetta_kernel_(vgprs|scratch_bytes|lds_bytes|occupancy_waves|duration_seconds_count)\{' "$OUT/metrics.txt" | grep -E 'gemm_w8a8|matvec_|attn_decode' | head -16
fi
if has llama; then
  stamp "waiting for the llama.cpp build"
  wait $llama_pid || true
  if [[ "$(cat "$OUT/llama-build.rc" 2>/dev/null)" == 0 ]]; then
    stamp "llama-bench on the same file"
    $LLAMA_DIR/build/bin/llama-bench -m $BENCH_MODEL -ngl 99 -p 512,2048 -n 128 -r 3 -o json > "$OUT/llama-bench.json" 2> "$OUT/llama-bench.log" || tail -5 "$OUT/llama-bench.log"
    python3 - "$OUT/civetta-off.json" "$OUT/llama-bench.json" <<'EOF' || true
import json, sys
civ = json.load(open(sys.argv[1])); ll = json.load(open(sys.argv[2]))
def llama(kind, n):
    for r in ll:
        if kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0: return r["avg_ts"]
        if kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0: return r["avg_ts"]
print("| test | civetta cuda t/s | llama.cpp cuda t/s | civetta / llama.cpp |\n|---|---:|---:|---:|")
for t in civ["tests"]:
    l = llama(t["kind"], int(t["name"][2:]))
    print(f"| {t['name']} | {t['mean_tps']:.1f} | {l:.1f} | {t['mean_tps'] / l:.2f}x |" if l else f"| {t['name']} | {t['mean_tps']:.1f} | - | - |")
EOF
    # summary.json (issue #17): civetta vs llama.cpp per test, and decode t/s over the bandwidth
    # bound (copy bandwidth / bench-model file size, about the weight bytes read per token).
    python3 - "$OUT/civetta-off.json" "$OUT/llama-bench.json" "$OUT/bandwidth.txt" "$BENCH_MODEL" "$BENCH_MODEL_ARGS" \
      > "$OUT/summary.json" <<'EOF' || true
import json, os, re, sys
civ = json.load(open(sys.argv[1])); ll = json.load(open(sys.argv[2]))
bw = re.search(r"([0-9.]+) GB/s", open(sys.argv[3]).read() if os.path.exists(sys.argv[3]) else "")
def llama(kind, n):
    for r in ll:
        if kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0: return r["avg_ts"]
        if kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0: return r["avg_ts"]
tests = []
for t in civ["tests"]:
    l = llama(t["kind"], int(t["name"][2:]))
    tests.append({"model": sys.argv[5], "test": t["name"], "civetta": round(t["mean_tps"], 1),
                  "llama_cpp": round(l, 1) if l else None, "ratio": round(t["mean_tps"] / l, 3) if l else None})
tg = [t for t in civ["tests"] if t["kind"] == "tg"]
bound = float(bw.group(1)) * 1e9 / os.path.getsize(sys.argv[4]) if bw else None
print(json.dumps({"tests": tests, "roofline_fraction": round(tg[0]["mean_tps"] / bound, 3) if tg and bound else None}, indent=1))
EOF
    cat "$OUT/summary.json"
  else
    echo "llama.cpp build failed:"; tail -20 "$OUT/llama-build.log" "$OUT/llama-cmake.log" 2>/dev/null || true
  fi
fi

stamp "done"
