"""Tokens/s of one HTTP SSE stream at a time, measured like `civetta bench --remote` at
concurrency 1 (generated tokens / wall-clock seconds over sequential requests, same prompt,
greedy, ignore_eos), to compare the HTTP API's streaming with gRPC's.

usage: scripts/http_stream_tps.py http://HOST:PORT REQUESTS MAX_TOKENS
"""
import json
import sys
import time

try:  # openai >= 3 brings httpx2; older environments have httpx
    import httpx2 as httpx
except ImportError:
    import httpx

base, n, max_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompt = "Write a short story about a lighthouse keeper."
body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "seed": 1, "ignore_eos": True,
        "stream": True, "return_tokens": True}
tokens = 0
with httpx.Client(timeout=600) as c:
    t0 = time.perf_counter()
    for _ in range(n):
        with c.stream("POST", f"{base}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    ch = json.loads(line[6:])["choices"]
                    if ch:
                        tokens += len(ch[0].get("tokens", []))
    secs = time.perf_counter() - t0
print(json.dumps({"tokens": tokens, "seconds": secs, "tokens_per_second": tokens / secs}))
