# Session 15 call 2: medians per (model, build, test) over the timing-off rounds, the 5% overhead,
# llama.cpp fa0 / fa1 and the ratios; writes summary.json (docs/gpu-runs convention).
import glob, json, os, statistics, sys
o = sys.argv[1]
def load(p):
    try: return json.load(open(p))
    except Exception: return None
res = {}  # (q, build, tag) -> {test: tps}
for p in glob.glob(os.path.join(o, "civ-*.json")):
    q, b, tag = os.path.basename(p)[4:-5].split("-")
    d = load(p)
    if d: res[(q, b, tag)] = {t["name"]: t["mean_tps"] for t in d["tests"]}; res[(q, b, tag)]["_hash"] = (d.get("hashes") or {}).get("overall_sha256", "")[:16]
def med(q, b, test, tags=("r1", "r2", "r3")):
    v = [res[(q, b, t)][test] for t in tags if (q, b, t) in res and test in res[(q, b, t)]]
    return (statistics.median(v), v) if v else (0.0, [])
def llama(q, fa, test):
    for r in load(os.path.join(o, f"llama-{q}.json")) or []:
        kind, n = test[:2], int(test[2:])
        if r.get("flash_attn") in (fa, bool(fa)) and ((kind == "pp" and r["n_prompt"] == n and r["n_gen"] == 0) or (kind == "tg" and r["n_gen"] == n and r["n_prompt"] == 0)):
            return r["avg_ts"]
    return 0.0
rows, summary = [], {"tests": []}
print("| model | test | before (rounds) | after (rounds) | after/before | llama fa0 | fa1 | after/fa0 | after/fa1 |")
print("|---|---|---|---|---:|---:|---:|---:|---:|")
for q in ("q8_0", "q4_k"):
    for test in ("pp512", "tg128"):
        (bm, bv), (am, av) = med(q, "before", test, ("r1", "r2")), med(q, "after", test, ("r1", "r2"))
        l0, l1 = llama(q, 0, test), llama(q, 1, test)
        f = lambda v: " / ".join(f"{x:.1f}" for x in v)
        print(f"| {q} | {test} | {bm:.1f} ({f(bv)}) | {am:.1f} ({f(av)}) | {am/bm if bm else 0:.3f} | {l0:.1f} | {l1:.1f} | {am/l0 if l0 else 0:.3f} | {am/l1 if l1 else 0:.3f} |")
        for fa, l in ((0, l0), (1, l1)):
            summary["tests"].append({"model": f"1.4B {q}", "test": test, "civetta": am, "llama_cpp": l, "llama_cpp_fa": fa, "ratio": am / l if l else None})
print("\n5% kernel timing vs off (same build; off = median of its rounds):")
for q in ("q8_0", "q4_k"):
    for b in ("before", "after"):
        on = res.get((q, b, "on5"), {})
        if on: print(q, b, {t: round(on.get(t, 0) / med(q, b, t)[0], 3) if med(q, b, t)[0] else None for t in ("pp512", "tg128")}, "on5:", {t: round(on.get(t, 0), 1) for t in ("pp512", "tg128")})
print("\nhashes:", {f"{k[0]}-{k[1]}-{k[2]}": v["_hash"] for k, v in sorted(res.items())})
bytes_per_token = {"q8_0": None, "q4_k": None}
json.dump(summary, open(os.path.join(o, "summary.json"), "w"), indent=1)
