# Prefix-cache TTFT over the OpenAI HTTP API (stdlib only): a 1,000-token "system prompt"
# followed by a short suffix; first request (miss) vs a second one sharing the prefix (hit).
import json, random, sys, time, urllib.request
base = sys.argv[1]
models = json.load(urllib.request.urlopen(base + "/v1/models"))
model = models["data"][0]["id"]
def complete(tokens):
    body = json.dumps({"model": model, "prompt": tokens, "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
    t = time.perf_counter()
    r = json.load(urllib.request.urlopen(req))
    return time.perf_counter() - t, r.get("usage", {})
rows = []
for trial in range(3):
    rnd = random.Random(trial)
    system = [rnd.randrange(100, 40000) for _ in range(1000)]
    t1, u1 = complete(system + [rnd.randrange(100, 40000) for _ in range(8)])
    t2, u2 = complete(system + [rnd.randrange(100, 40000) for _ in range(8)])
    cached = (u2.get("prompt_tokens_details") or {}).get("cached_tokens")
    rows.append((t1, t2))
    print(f"trial {trial}: first {t1*1e3:.0f} ms, second {t2*1e3:.0f} ms, ratio {t2/t1:.3f}, second cached_tokens={cached}, prompt_tokens={u2.get('prompt_tokens')}")
import statistics as st
print(f"median first {st.median(r[0] for r in rows)*1e3:.0f} ms, median second {st.median(r[1] for r in rows)*1e3:.0f} ms, median ratio {st.median(r[1]/r[0] for r in rows):.3f}")
