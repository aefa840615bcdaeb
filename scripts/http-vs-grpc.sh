#!/usr/bin/env bash
# HTTP (OpenAI SSE) vs gRPC streaming overhead for one stream (docs/BENCH.md): one daemon on 2
# pinned cores, runs alternated gRPC, HTTP, gRPC, ... from client processes on other cores;
# medians. Model: a SmolLM2-shaped synthetic Q4_1 file (or MODEL=...).
#
# usage: scripts/http-vs-grpc.sh CIVETTA_BIN [ROUNDS]   env: OUT (build/http-vs-grpc), MODEL,
#        SERVER_CPUS (0,1), CLIENT_CPUS (4-7), REQUESTS (4), TOKENS (128)
set -euo pipefail
bin=$1 rounds=${2:-6}
here=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-build/http-vs-grpc}
SERVER_CPUS=${SERVER_CPUS:-0,1} CLIENT_CPUS=${CLIENT_CPUS:-4-7} REQUESTS=${REQUESTS:-4} TOKENS=${TOKENS:-128}
mkdir -p "$OUT"
model=${MODEL:-$OUT/smollm2-shaped-q4_1.gguf}
[[ -f $model ]] || "$bin" model synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 \
  --heads 9 --kv-heads 3 --vocab 49152 --tied --seed 1 -o "$model" >/dev/null
CIVETTA_ENGINE__THREADS=2 taskset -c "$SERVER_CPUS" "$bin" serve -m "$model" --grpc-addr 127.0.0.1:50151 \
  --metrics-addr 127.0.0.1:0 --http-addr 127.0.0.1:50152 > "$OUT/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q listening "$OUT/serve.log" && break; sleep 0.2; done
for r in $(seq "$rounds"); do
  taskset -c "$CLIENT_CPUS" "$bin" bench --remote 127.0.0.1:50151 --concurrency 1 --requests "$REQUESTS" -n "$TOKENS" -q -o json \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"][0]["tokens_per_second"])' >> "$OUT/grpc.txt"
  taskset -c "$CLIENT_CPUS" python3 "$here/http_stream_tps.py" http://127.0.0.1:50152 "$REQUESTS" "$TOKENS" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_second"])' >> "$OUT/http.txt"
done
python3 - "$OUT" <<'PY'
import statistics as st, sys
g = [float(x) for x in open(sys.argv[1] + "/grpc.txt")]
h = [float(x) for x in open(sys.argv[1] + "/http.txt")]
print("gRPC tok/s:", " ".join(f"{x:.1f}" for x in g))
print("HTTP tok/s:", " ".join(f"{x:.1f}" for x in h))
print(f"median gRPC {st.median(g):.2f}, median HTTP {st.median(h):.2f}, HTTP/gRPC {st.median(h) / st.median(g):.4f}")
PY
