# Shared by the session 18 calls: paths, binaries, models.
# F = main (session 18); B2 = session 17's committed behaviour (9aab3b6 + capture logs); E = B2 + pooled scratch taken at
# the lowest free address (Pool::take) + the DIAG log of how a new tape differs from cached ones.
G=$PWD/.gpu; S=$G/18; W=/tmp/s18; mkdir -p $W
t0=$(date +%s); stamp() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
for b in $S/*.xz; do n=$(basename $b .xz); [[ -x $W/$n ]] || { xz -dc $b > $W/$n && chmod +x $W/$n; }; done
K=$S/kernels
SZ="--arch llama --size 1b --layers 28 --dim 1536 --ffn 8960 --heads 12 --kv-heads 2 --context 8192"
synth() { for q in "$@"; do [[ -s $W/m-$q.gguf ]] || { $W/civetta-F model synth $SZ --quant $q -o $W/tmp-$q.gguf > /dev/null && mv $W/tmp-$q.gguf $W/m-$q.gguf; }; done; }
civ() { # BUILD MODEL TAG [extra bench args]
  local b=$1 q=$2 tag=$3; shift 3
  CIVETTA_LOG=civetta::backend::gpu=debug timeout 120 $W/civetta-$b bench -m $W/m-$q.gguf --backend cuda --kernel-dir $K -p 512 -n 128 -r 5 --prefill-batch 2048 -q -o json "$@" > $O/civ-$q-$b-$tag.json 2> $O/civ-$q-$b-$tag.err
  local e=$O/civ-$q-$b-$tag.err
  printf "%-4s %-8s %s | eager %s captures %s timed-captures %s\n" $b $tag \
    "$(python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]));print(' '.join('%s=%.1f'%(t['name'],st.median(t['samples_tps'])) for t in d['tests']))" $O/civ-$q-$b-$tag.json 2>&1 | tail -1)" \
    "$(grep -c 'run eagerly' $e)" "$(grep -c 'GPU graph captured' $e)" "$(grep -c 'timed graph captured' $e)"
}
