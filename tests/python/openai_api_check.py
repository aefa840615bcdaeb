"""Checks civetta's OpenAI-compatible HTTP API with the official `openai` client.

Run by tests/http_api.rs against a real `civetta serve` started with an auth token,
--max-active 1 --max-queue 0 (so a second request is refused with 429) and a long
--shutdown-grace (so the 503 while draining can be seen). The last step sends SIGTERM
to the daemon. Exits non-zero with a message on the first failed check.

usage: openai_api_check.py --base-url http://HOST:PORT/v1 --metrics HOST:PORT
                           --token TOKEN --model NAME --pid PID --max-body BYTES
"""

import argparse
import math
import os
import signal
import sys
import time

import openai

try:  # openai >= 3 is built on httpx2; older releases on httpx
    import httpx2 as httpx
except ImportError:
    import httpx

ap = argparse.ArgumentParser()
ap.add_argument("--base-url", required=True)
ap.add_argument("--metrics", required=True)
ap.add_argument("--token", required=True)
ap.add_argument("--model", required=True)
ap.add_argument("--pid", type=int, required=True)
ap.add_argument("--max-body", type=int, required=True)
args = ap.parse_args()

# No retries: the 429 and 503 must reach the checks, not be retried away.
client = openai.OpenAI(base_url=args.base_url, api_key=args.token, max_retries=0, timeout=300)
MSGS = [{"role": "user", "content": "Name three colours."}]
# Long enough to still be running while the next checks happen (ignore_eos: a vLLM /
# llama.cpp extension civetta accepts).
LONG = {"ignore_eos": True}


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what.split(':')[0]}")


def metric(name, **labels):
    text = httpx.get(f"http://{args.metrics}/metrics", timeout=30).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, value = line.rsplit(" ", 1)
        if series.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(pred, what, seconds=60):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    sys.exit(f"FAIL: timed out waiting for {what}")


def expect_error(cls, status, fn, code=None, param=None):
    try:
        fn()
    except cls as e:
        check(e.status_code == status, f"{cls.__name__} {status}: got {e.status_code}")
        body = e.body if isinstance(e.body, dict) else {}
        if code is not None:
            check(body.get("code") == code, f"error code {code}: body {e.body}")
        if param is not None:
            check(body.get("param") == param, f"error param {param}: body {e.body}")
        check(isinstance(body.get("message"), str) and body.get("type"), f"OpenAI error shape: {e.body}")
        return e
    sys.exit(f"FAIL: expected {cls.__name__} ({status})")


# ---- models -------------------------------------------------------------------------
models = [m.id for m in client.models.list()]
check(models == [args.model], f"models.list: {models}")

# ---- chat, non-streaming and streaming give the same greedy answer ----------------------
r = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=12, temperature=0, seed=1)
c = r.choices[0]
check(r.object == "chat.completion" and c.message.role == "assistant", f"chat object: {r}")
check(c.finish_reason in ("stop", "length") and c.message.content, f"chat answer: {c}")
u = r.usage
check(u.prompt_tokens > 0 and 0 < u.completion_tokens <= 12 and u.total_tokens == u.prompt_tokens + u.completion_tokens, f"chat usage: {u}")

stream = client.chat.completions.create(
    model=args.model, messages=MSGS, max_tokens=12, temperature=0, seed=1, stream=True, stream_options={"include_usage": True}
)
chunks = list(stream)
check(chunks[0].choices[0].delta.role == "assistant", f"first chunk has the role: {chunks[0]}")
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
check(text == c.message.content, f"streamed text equals non-streamed: {text!r} vs {c.message.content!r}")
check(finishes == [c.finish_reason], f"one finish_reason in the stream: {finishes}")
# Same token counts; the repeat's prompt is served from the prefix cache (cached_tokens > 0).
su = chunks[-1].usage
same = su is not None and (su.prompt_tokens, su.completion_tokens, su.total_tokens) == (u.prompt_tokens, u.completion_tokens, u.total_tokens)
check(chunks[-1].choices == [] and same, f"include_usage chunk last, same usage: {chunks[-1]}")
check(su.prompt_tokens_details is not None and su.prompt_tokens_details.cached_tokens > 0, f"the repeated prompt hits the prefix cache: {su}")
check(all(ch.object == "chat.completion.chunk" for ch in chunks), "chunk objects")

# logprobs: one entry per generated token, all <= 0.
r = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=6, temperature=0, logprobs=True)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens and all(t.logprob <= 0 for t in lp), f"chat logprobs: {lp}")

# top_logprobs: the 3 most likely tokens of each step, most likely first; greedy picks the
# first of them, with the same logprob; streamed the same as non-streamed.
r = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
lp = r.choices[0].logprobs.content
check(len(lp) == r.usage.completion_tokens, f"chat top_logprobs entries: {lp}")
for t in lp:
    alts = t.top_logprobs
    check(len(alts) == 3 and all(a.logprob <= 0 for a in alts), f"3 alternatives: {t}")
    check([a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True), f"most likely first: {t}")
    check(alts[0].bytes == t.bytes and alts[0].logprob == t.logprob, f"greedy token is the top alternative: {t}")
    check(sum(math.exp(a.logprob) for a in alts) <= 1.0 + 1e-5, f"probabilities: {t}")
stream = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True)
streamed = [t for ch in stream if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content]
check([(t.bytes, [a.bytes for a in t.top_logprobs]) for t in streamed] == [(t.bytes, [a.bytes for a in t.top_logprobs]) for t in lp],
      f"streamed top_logprobs equal non-streamed: {streamed} vs {lp}")
expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=2, logprobs=True, top_logprobs=21), param="top_logprobs")

# ---- completions ------------------------------------------------------------------------
PROMPT = "The capital of France is"
r = client.completions.create(model=args.model, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=0)
ch = r.choices[0]
check(r.object == "text_completion" and ch.text and ch.finish_reason in ("stop", "length"), f"completion: {r}")
check(len(ch.logprobs.token_logprobs) == r.usage.completion_tokens, f"completion logprobs: {ch.logprobs}")
r = client.completions.create(model=args.model, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3)
clp = r.choices[0].logprobs
check(len(clp.top_logprobs) == len(clp.tokens) == r.usage.completion_tokens, f"completion top_logprobs per token: {clp}")
for tok, lpv, alts in zip(clp.tokens, clp.token_logprobs, clp.top_logprobs):
    # Keys are token texts: two tokens of the same text would merge, hence <= 3.
    check(1 <= len(alts) <= 3 and alts.get(tok) == lpv and lpv == max(alts.values()), f"completion alternatives: {tok!r} {lpv} {alts}")
streamed = "".join(x.choices[0].text for x in client.completions.create(model=args.model, prompt=PROMPT, max_tokens=10, temperature=0, stream=True) if x.choices)
check(streamed == ch.text, f"streamed completion equals non-streamed: {streamed!r} vs {ch.text!r}")
ids = client.completions.create(model=args.model, prompt=[1, 2, 3], max_tokens=3, temperature=0)
check(ids.usage.prompt_tokens == 3, f"token-array prompt: {ids.usage}")

# ---- stop sequences ---------------------------------------------------------------------
full = client.completions.create(model=args.model, prompt=PROMPT, max_tokens=24, temperature=0, extra_body=LONG).choices[0].text
mid = len(full) // 2
stop = full[mid : mid + 3]
check(len(stop) == 3 and stop.strip(), f"a stop string from the middle of {full!r}")
cut = client.completions.create(model=args.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop, "\u2603never"], extra_body=LONG)
check(cut.choices[0].text == full[: full.find(stop)], f"stop cuts before the stop text: {cut.choices[0].text!r}, full {full!r}, stop {stop!r}")
check(cut.choices[0].finish_reason == "stop", f"finish_reason stop: {cut.choices[0].finish_reason}")
cut_stream = "".join(
    x.choices[0].text
    for x in client.completions.create(model=args.model, prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True, extra_body=LONG)
    if x.choices
)
check(cut_stream == cut.choices[0].text, f"streamed stop equals non-streamed: {cut_stream!r}")

# ---- seeds --------------------------------------------------------------------------------
def sampled(seed):
    return client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=12, temperature=1.0, seed=seed).choices[0].message.content


a, b = sampled(42), sampled(42)
check(a == b, f"same seed, same text: {a!r} vs {b!r}")
others = {sampled(s) for s in (1, 2, 3)}
check(len(others | {a}) > 1, f"different seeds sample differently: {others | {a}}")

# ---- errors ---------------------------------------------------------------------------------
bad = openai.OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0)
expect_error(openai.AuthenticationError, 401, lambda: bad.chat.completions.create(model=args.model, messages=MSGS), code="invalid_api_key")
expect_error(openai.AuthenticationError, 401, lambda: bad.models.list())
expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=args.model, messages=MSGS, n=2), param="n")
expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=args.model, messages=MSGS, temperature=5), param="temperature")
expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=100000))
expect_error(openai.NotFoundError, 404, lambda: client.chat.completions.create(model="gpt-4o", messages=MSGS), code="model_not_found", param="model")
huge = [{"role": "user", "content": "x" * (args.max_body + 1)}]
expect_error(openai.APIStatusError, 413, lambda: client.chat.completions.create(model=args.model, messages=huge), code="request_too_large")
raw = httpx.post(f"{args.base_url}/chat/completions", content=b"{not json", headers={"Authorization": f"Bearer {args.token}"})
check(raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error", f"bad JSON is 400: {raw.text}")

# 429: the one slot is taken by a long stream and nothing may queue.
gen_before = metric("civetta_generated_tokens_total")
cancelled_before = metric("civetta_requests_total", rpc="/v1/chat/completions", code="CANCELLED")
long = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=400, temperature=0, stream=True, extra_body=LONG)
it = iter(long)
for _ in range(3):
    next(it)
check(metric("civetta_active_sequences") == 1, "the long stream holds the slot")
e = expect_error(openai.RateLimitError, 429, lambda: client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=2), code="queue_full")
check(int(e.response.headers["retry-after"]) >= 1 and int(e.response.headers["retry-after-ms"]) > 0, f"Retry-After: {e.response.headers}")

# Cancellation: closing the stream frees the slot long before its 400 tokens.
long.close()
wait_for(lambda: metric("civetta_active_sequences") == 0, "the slot to free after the client closed the stream")
wait_for(lambda: metric("civetta_requests_total", rpc="/v1/chat/completions", code="CANCELLED") == cancelled_before + 1, "the request counted CANCELLED")
made = metric("civetta_generated_tokens_total") - gen_before
check(made < 400, f"the cancelled stream stopped early ({made:.0f} of 400 tokens)")
r = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=2, temperature=0)
check(r.usage.completion_tokens >= 1, "the freed slot serves the next request")

# 503: after SIGTERM, with a stream still running, health and new requests say 503.
long = client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=400, temperature=0, stream=True, extra_body=LONG)
it = iter(long)
next(it)
health = httpx.get(f"{args.base_url.removesuffix('/v1')}/health")
check(health.status_code == 200, f"health 200 while serving: {health.status_code}")
os.kill(args.pid, signal.SIGTERM)
base = args.base_url.removesuffix("/v1")
wait_for(lambda: httpx.get(f"{base}/health").status_code == 503, "/health to answer 503 after SIGTERM", 20)
expect_error(openai.InternalServerError, 503, lambda: client.chat.completions.create(model=args.model, messages=MSGS, max_tokens=2), code="shutting_down")
next(it)
check(True, "the running stream goes on during the grace period")
long.close()
print("all checks passed")
