# Session 16 call 2: medians per (model, build, test) over the timing-off rounds (s15 = session 15's
# build, ovl = this session's with overlapped launches, plain = the same without), the 5% timing
# overhead, llama.cpp fa0 / fa1 against ovl's civL runs (same call, interleaved), roofline; writes
# summary.json (docs/gpu-runs convention).
import glob, json, os, statistics, sys
o = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
res = {}  # (q, build, tag) -> {test: tps}
for p in glob.glob(os.path.join(o, "civ-*.json")):
    q, b, tag = os.path.basename(p)[4:-5].split("-")
    d = load(p)
    if d:
        res[(q, b, tag)] = {t["name"]: t["mean_tps"] for t in d["tests"]}
        res[(q, b, tag)]["_hash"] = (d.get("hashes") or {}).get("overall_sha256", "")[:16]
def med(q, b, test, tags=("r1", "r2", "r3")):
    v = [res[(q, b, t)][test] for t in tags if (q, b, t) in res and test in res[(q, b, t)]]
    return (statistics.median(v), v) if v else (0.0, [])
def llama(q, fa, test):
    for r in load(os.path.join(o, f"llama-{q}.json")) or []:
        kind, n = test[:2], int(test[2:])
        if r.get("flash_attn") in (fa, bool(fa)) and ((kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0) or (kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)):
            return r["avg_ts"]
    return 0.0
f = lambda v: " / ".join(f"{x:.1f}" for x in v)
builds = [b for b in ("s15", "k15", "ovl", "l2", "final", "plain") if any(k[1] == b for k in res)]
print("| model | test | " + " | ".join(f"{b} (rounds)" for b in builds) + " | " + " | ".join(f"{b}/s15" for b in builds[1:]) + " |")
print("|---|---|" + "---|" * len(builds) + "---:|" * (len(builds) - 1))
for q in ("q8_0", "q4_k"):
    for test in ("pp512", "tg128"):
        m = {b: med(q, b, test) for b in builds}
        s15 = m["s15"][0]
        print(f"| {q} | {test} | " + " | ".join(f"{m[b][0]:.1f} ({f(m[b][1])})" for b in builds) + " | " + " | ".join(f"{m[b][0]/s15 if s15 else 0:.3f}" for b in builds[1:]) + " |")
print("\nkernel timing on vs off (same build; off = median of its r1, r2, r3):")
for (q, b, tag), on in sorted(res.items()):
    if tag.startswith("on"):
        print(q, b, tag, {t: round(on.get(t, 0) / med(q, b, t, ("r1", "r2", "r3"))[0], 3) for t in ("pp512", "tg128") if med(q, b, t, ("r1", "r2", "r3"))[0]}, {t: round(on.get(t, 0), 1) for t in ("pp512", "tg128")})
print("\nhashes:", {f"{k[0]}-{k[1]}-{k[2]}": v["_hash"] for k, v in sorted(res.items())})
# llama.cpp against the ovl build's civL runs (pp512, pp2048, tg128; median of 2).
civl = {}
BEST = sys.argv[2] if len(sys.argv) > 2 else ""  # which build's civL runs face llama.cpp
for p in glob.glob(os.path.join(o, "civL-*.json")):
    q, tag = os.path.basename(p)[5:-5].split("-")
    d = load(p)
    if d and tag.startswith(BEST):
        for t in d["tests"]: civl.setdefault((q, t["name"]), []).append(t["mean_tps"])
# Roofline: session 8's H100 copy bandwidth 2951 GB/s over the weight bytes per token
# (session 15: 1,970 t/s for Q8_0, 3,714 for Q4_K).
bound = {"q8_0": 1970.0, "q4_k": 3714.0}
summary = {"tests": [], "roofline_fraction": {}}
print("\n| model | test | civetta ovl (runs) | llama fa0 | fa1 | /fa0 | /fa1 |")
print("|---|---|---|---:|---:|---:|---:|")
for q in ("q8_0", "q4_k"):
    for test in ("pp512", "pp2048", "tg128"):
        v = civl.get((q, test), [])
        c = statistics.median(v) if v else 0.0
        l0, l1 = llama(q, 0, test), llama(q, 1, test)
        print(f"| {q} | {test} | {c:.1f} ({f(v)}) | {l0:.1f} | {l1:.1f} | {c/l0 if l0 else 0:.3f} | {c/l1 if l1 else 0:.3f} |")
        for fa, l in ((0, l0), (1, l1)):
            summary["tests"].append({"model": f"1.4B {q}", "test": test, "civetta": c, "llama_cpp": l, "llama_cpp_flash_attn": fa, "ratio": c / l if l else None})
    tg = statistics.median(civl.get((q, "tg128"), [0.0]))
    summary["roofline_fraction"][f"1.4B {q}"] = round(tg / bound[q], 3)
print("\nroofline fraction (tg128 / copy-bandwidth bound):", summary["roofline_fraction"])
json.dump(summary, open(os.path.join(o, "summary.json"), "w"), indent=1)
