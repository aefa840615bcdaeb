#!/usr/bin/env bash
# Interleaved CPU A/B of two civetta binaries and llama.cpp on an idle many-core host (the device
# machine's 16-core Xeon: issue #18), 2 threads pinned (`taskset -c 0,1`) and 16 threads, on
# synthetic models made there (real files cannot travel): SmolLM2-shaped Q4_1, Gemma-3-270M-shaped
# gemma3 in Q5_0 (the real Q4_K_M file's 640-wide matrices are Q5_0; its Q4_K/Q6_K ffn_down and
# attn_output are Q5_0 here too) and the 1B Q4_K preset.
#
#   usage: bash scripts/cpu-ab-device.sh DIR OUTDIR
#   DIR holds civetta-after, optionally civetta-before (stripped release builds) and optionally
#   llama/bin/llama-bench (the no-AMX reference build; skipped when it does not run there).
#   env: ROUNDS (3), BUDGET seconds after which no new case starts (420), MODELS (/tmp/cpu-ab-models),
#        TINY=1 (tiny models, pp16/tg4, one round: a dry run of the script itself).
# Only the system python3 is needed (scripts/perf-ab.py uses the standard library); taskset on the
# python process pins every benchmark it starts.
set -euo pipefail
dir=$1 out=$2
rounds=${ROUNDS:-3} budget=${BUDGET:-420} models=${MODELS:-/tmp/cpu-ab-models}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out" "$models"
before=$dir/civetta-before after=$dir/civetta-after
start=$(date +%s)
{ lscpu; grep -o 'amx[a-z_0-9]*' /proc/cpuinfo | sort -u; nproc; } > "$out/host.txt" 2>&1 || true
"$after" env > "$out/env.txt" 2>&1 || true
configs="$before $after"
[[ -x $before ]] || configs="$after"  # no before binary: after vs llama.cpp only
if [[ -x $dir/llama/bin/llama-bench ]]; then
  ldd "$dir/llama/bin/llama-bench" > "$out/llama-ldd.txt" 2>&1 || true
  if "$dir/llama/bin/llama-bench" --help > /dev/null 2>&1; then configs="$configs LLAMA"; else echo "llama-bench does not run here (see llama-ldd.txt)"; fi
fi
synth() { "$after" model synth "$@" > /dev/null; }
if [[ ${TINY:-0} == 1 ]]; then
  synth --arch llama --quant q4_1 --size tiny -o "$models/smol-q4_1.gguf"
  synth --arch gemma3 --quant q5_0 --size tiny --head-dim 256 -o "$models/gemma270m-q5_0.gguf"
  synth --arch llama --quant q4_k --size tiny -o "$models/1b-q4_k.gguf"
  cases=("smol-q4_1 2 16 4" "gemma270m-q5_0 2 16 4" "1b-q4_k 2 16 4")
  rounds=1
else
  synth --arch llama --quant q4_1 --size small --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 --vocab 49152 --tied -o "$models/smol-q4_1.gguf"
  synth --arch gemma3 --quant q5_0 --layers 18 --dim 640 --ffn 2048 --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --tied -o "$models/gemma270m-q5_0.gguf"
  synth --arch llama --quant q4_k --size 1b -o "$models/1b-q4_k.gguf"
  synth --arch llama --quant q8_0 --size 1b -o "$models/1b-q8_0.gguf"
  # 1B at 2 threads: pp128/tg32 (pp512 does not fit the time of one device command).
  # CASES overrides the list ("name threads pp tg;..."), in the order they should run.
  cases=("smol-q4_1 2 512 128" "smol-q4_1 16 512 128" "1b-q4_k 16 512 128" "1b-q4_k 2 128 32" "1b-q8_0 16 512 128"
    "1b-q8_0 2 128 32" "gemma270m-q5_0 2 512 128" "gemma270m-q5_0 16 512 128")
  if [[ -n ${CASES:-} ]]; then IFS=';' read -r -a cases <<< "$CASES"; fi
fi
echo "models ready after $(($(date +%s) - start)) s"
for c in "${cases[@]}"; do
  read -r name threads pp tg <<< "$c"
  if (($(date +%s) - start > budget)); then echo "budget spent: skipped $name $threads threads"; continue; fi
  pin=()
  [[ $threads == 2 ]] && pin=(taskset -c 0,1)
  # shellcheck disable=SC2086 # configs are words
  MODEL=$models/$name.gguf THREADS=$threads PP=$pp TG=$tg LLAMA_CPP_DIR=$dir/llama \
    "${pin[@]}" python3 "$here/perf-ab.py" "$rounds" $configs > "$out/$name-t$threads.md" 2> "$out/$name-t$threads.err" ||
    echo "$name $threads threads failed (see $name-t$threads.err)"
  cat "$out/$name-t$threads.md"
done
echo "done after $(($(date +%s) - start)) s"
