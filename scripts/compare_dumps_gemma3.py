# Compares examples/dump_forward.rs output (civetta) with scripts/llama_cpp_dump.cpp output
# (llama.cpp) for the gemma3 graph, tensor by tensor per layer.
# usage: compare_dumps_gemma3.py CIVETTA_DIR LLAMA_DIR [LAYERS]
import numpy as np, sys, re
cd, ld = sys.argv[1], sys.argv[2]
layers = int(sys.argv[3]) if len(sys.argv) > 3 else 99
ll = {}
for line in open(f"{ld}/index.txt"):
    seq, rest = line.split(" ", 1)
    parts = rest.split()
    # name may contain spaces ("(view)"); op is third from the end-4
    name = " ".join(parts[:-5]); op = parts[-5]
    ll.setdefault((name, op), []).append(np.fromfile(f"{ld}/{seq}.bin", dtype=np.float32))
def L(name, op, i=0):
    v = ll.get((name, op)); return v[i] if v else None
civ = [(l.split()[0], l.split()[1]) for l in open(f"{cd}/index.txt")]
cv = lambda s: np.fromfile(f"{cd}/{s}.bin", dtype=np.float32)
# civetta per-layer sequence
names = ["attn_norm:MUL", "Qcur:MUL_MAT", "Kcur:MUL_MAT", "Vcur:MUL_MAT", "Qcur_normed:MUL", "Kcur_normed:MUL",
         "Qcur:ROPE", "Kcur:ROPE", "FA", "WO", "attn_post_norm:MUL", "sa_out:ADD", "ffn_norm:MUL",
         "ffn_gate:MUL_MAT", "ffn_up:MUL_MAT", "ffn_geglu:GEGLU", "ffn_out:MUL_MAT", "ffn_post_norm:MUL", "l_out:ADD"]
i = 0
assert civ[0][1] == "embed" and civ[1][1] == "scale"
def rep(tag, a, b):
    if a is None or b is None or a.size != b.size:
        print(f"{tag:28s} missing/size {None if a is None else a.size} {None if b is None else b.size}"); return
    d = np.abs(a - b); m = np.abs(b).max()
    neq = np.count_nonzero(a != b)
    print(f"{tag:28s} max|d|/max|x| {d.max()/max(m,1e-30):.2e}  differing {neq}/{a.size}")
rep("inp_scaled", cv(civ[1][0]), L("inp_scaled", "SCALE"))
i = 2
# llama's unnamed FA and wo outputs per layer, in order
fa = [np.fromfile(f"{ld}/{l.split()[0]}.bin", dtype=np.float32) for l in open(f"{ld}/index.txt") if " FLASH_ATTN_EXT " in l]
wo = []
lines = open(f"{ld}/index.txt").read().splitlines()
for k, l in enumerate(lines):
    if l.split()[1].startswith("kqv_out-"):
        wo.append(np.fromfile(f"{ld}/{lines[k+1].split()[0]}.bin", dtype=np.float32))
for layer in range(min(layers, 18)):
    for n in names:
        s, op = civ[i]; i += 1
        a = cv(s)
        if n == "FA": b = fa[layer]
        elif n == "WO": b = wo[layer]
        else:
            nm, o = n.split(":"); b = L(f"{nm}-{layer}", o)
        rep(f"L{layer} {n} ({op[:18]})", a, b)
