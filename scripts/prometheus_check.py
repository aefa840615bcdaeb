#!/usr/bin/env python3
"""Run a real Prometheus against a live civetta and evaluate every shipped query.

Started by scripts/prometheus-check.sh (make test-prometheus). Steps:
  1. promtool check config / check rules on the shipped files;
  2. `civetta serve` on loopback ports with a synthesized model;
  3. Prometheus in the foreground (temporary storage, loopback port) with
     deploy/prometheus/prometheus.yml rewritten to scrape that daemon every 1s and to
     evaluate the recording rules every 1s;
  4. Generate requests in the background while Prometheus scrapes;
  5. every PromQL expression of deploy/grafana/dashboards/*.json and of the recording
     rules (and every recorded series) through /api/v1/query: each must parse and
     return at least one sample that is a number;
  6. every civetta_* name in the dashboard and rules must be in a live /metrics scrape,
     except the GPU-only kernel resource gauges, which the CPU backend does not export
     (their queries must still parse).

Grafana variables are substituted before evaluation: $__rate_interval -> 1m,
$__interval -> 15s, $__range -> 5m, $job / ${job} -> civetta (the scrape job).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
RULES_DIR = DEPLOY / "prometheus" / "rules"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
SHIPPED_TARGET = "127.0.0.1:9464"

# Exported only by GPU backends (kernel resources from the code objects).
GPU_ONLY = {
    "civetta_kernel_vgprs",
    "civetta_kernel_sgprs",
    "civetta_kernel_scratch_bytes",
    "civetta_kernel_lds_bytes",
    "civetta_kernel_occupancy_waves",
}

GRAFANA_VARIABLES = [
    (re.compile(r"\$__rate_interval|\$\{__rate_interval\}"), "1m"),
    (re.compile(r"\$__interval|\$\{__interval\}"), "15s"),
    (re.compile(r"\$__range|\$\{__range\}"), "5m"),
    (re.compile(r"\$job\b|\$\{job\}"), "civetta"),
]

METRIC_NAME = re.compile(r"\b(civetta_[a-z0-9_]+)\b")
RECORDED_NAME = re.compile(r"\b([a-z_]+:civetta_[a-z0-9_]+:[a-z0-9_]+)\b")


class CheckFailed(Exception):
    pass


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {msg}", flush=True)


T0 = time.monotonic()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def wait_for(url: str, seconds: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise CheckFailed(f"{what} exited with {proc.returncode} before it was ready")
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise CheckFailed(f"{what} not ready at {url} after {seconds:.0f}s")


# ---------------------------------------------------------------- the shipped queries


def substitute_grafana_variables(expr: str) -> str:
    for pattern, value in GRAFANA_VARIABLES:
        expr = pattern.sub(value, expr)
    if "$" in expr:
        raise CheckFailed(f"unknown Grafana variable left in query: {expr}")
    return expr


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, expr) for every panel target and query variable of every dashboard."""
    out = []
    files = sorted(DASHBOARDS.glob("*.json"))
    if not files:
        raise CheckFailed(f"no dashboards in {DASHBOARDS}")
    for path in files:
        dash = json.loads(path.read_text())
        panels = list(dash.get("panels", []))
        while panels:
            panel = panels.pop(0)
            panels.extend(panel.get("panels", []))  # panels nested in collapsed rows
            for target in panel.get("targets", []):
                expr = target.get("expr", "").strip()
                if expr:
                    out.append((f"{path.name}: panel {panel.get('title')!r} {target.get('refId')}", expr))
        for var in dash.get("templating", {}).get("list", []):
            if var.get("type") != "query":
                continue
            query = var.get("query")
            query = query.get("query", "") if isinstance(query, dict) else str(query or "")
            # label_values(metric, label) is a Grafana helper: evaluate the metric selector.
            m = re.fullmatch(r"\s*label_values\((.+),\s*[a-zA-Z_]+\)\s*", query)
            if m:
                query = m.group(1)
            if query:
                out.append((f"{path.name}: variable ${var.get('name')}", query))
    return out


def rule_queries(rules_files: list[Path]) -> tuple[list[tuple[str, str]], list[str]]:
    """(where, expr) of every rule, and the recorded series names.

    Parsed without a YAML library (CI may lack one): the rules files use one
    `- record:` line then an `expr:` that is inline or a `|` block.
    """
    exprs, records = [], []
    for path in rules_files:
        lines = path.read_text().splitlines()
        i = 0
        record = None
        while i < len(lines):
            line = lines[i]
            m = re.match(r"\s*-\s*(record|alert):\s*(\S+)", line)
            if m:
                record = m.group(2)
                if m.group(1) == "record":
                    records.append(record)
            m = re.match(r"(\s*)expr:\s*(.*)$", line)
            if m:
                indent, rest = len(m.group(1)), m.group(2).strip()
                if rest in ("|", ">", "|-", ">-"):
                    body = []
                    i += 1
                    while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                        body.append(lines[i].strip())
                        i += 1
                    expr = " ".join(b for b in body if b)
                    i -= 1
                else:
                    expr = rest
                exprs.append((f"{path.name}: rule {record}", expr))
            i += 1
    if not exprs:
        raise CheckFailed("no rules found")
    return exprs, records


def names_in(expr: str) -> set[str]:
    """civetta_* metric names referenced by a query (not label values in quotes)."""
    unquoted = re.sub(r'"[^"]*"', '""', expr)
    recorded = set(RECORDED_NAME.findall(unquoted))
    without_recorded = RECORDED_NAME.sub("", unquoted)
    return set(METRIC_NAME.findall(without_recorded)) | recorded


def scrape_names(text: str) -> set[str]:
    names = set()
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def check_names(queries: list[tuple[str, str]], exported: set[str], recorded: set[str]) -> tuple[list[str], set[str]]:
    """Errors for names civetta does not export; and the GPU-only names referenced."""
    errors, gpu_only = [], set()
    for where, expr in queries:
        for name in names_in(expr):
            if ":" in name:
                if name not in recorded:
                    errors.append(f"{where}: recorded series {name} is not defined by the rules")
            elif name in exported:
                continue
            elif name in GPU_ONLY:
                gpu_only.add(name)
            else:
                errors.append(f"{where}: metric {name} is not exported by civetta (not in /metrics)")
    return errors, gpu_only


def self_test_name_check() -> None:
    """The name check must reject an unknown metric; otherwise the check proves nothing."""
    errors, _ = check_names([("self-test", 'rate(civetta_no_such_metric_total{job="x"}[1m])')],
                            {"civetta_requests_total"}, set())
    if not errors:
        raise CheckFailed("self-test: an unknown metric name was not flagged")
    errors, _ = check_names([("self-test", 'sum(rate(civetta_requests_total{rpc="civetta_x"}[1m]))')],
                            {"civetta_requests_total"}, set())
    if errors:
        raise CheckFailed(f"self-test: a known metric was flagged: {errors}")


# ---------------------------------------------------------------- processes


class Processes:
    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], log_path: Path) -> subprocess.Popen:
        log(f"start {name}: {' '.join(argv)}")
        fh = open(log_path, "w")
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def traffic(client: Path, grpc_addr: str, stop: threading.Event, counts: dict) -> None:
    prompts = ["hi", "The capital of France is", "Count to five:", "hello world"]
    i = 0
    while not stop.is_set():
        argv = [str(client), "--addr", f"http://{grpc_addr}", "--prompt", prompts[i % len(prompts)],
                "--max-tokens", "16"]
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        counts["ok" if res.returncode == 0 else "failed"] += 1
        if res.returncode != 0:
            counts["last_error"] = (res.stderr or res.stdout)[-500:]
        i += 1


# ---------------------------------------------------------------- main


def query(prom: str, expr: str) -> dict:
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    status, body = http_get(url, timeout=10)
    try:
        doc = json.loads(body)
    except json.JSONDecodeError:
        raise CheckFailed(f"Prometheus answered {status} with non-JSON: {body[:200]}")
    doc["_http_status"] = status
    return doc


def numeric_samples(doc: dict) -> int:
    result = doc["data"]["result"]
    kind = doc["data"]["resultType"]
    if kind == "vector":
        values = [r["value"][1] for r in result]
    elif kind == "matrix":
        values = [v[1] for r in result for v in r["values"]]
    elif kind == "scalar":
        values = [result[1]]
    else:
        values = []
    return sum(1 for v in values if not math.isnan(float(v)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--civetta", default=str(ROOT / "target/release/civetta"))
    parser.add_argument("--client", default=str(ROOT / "target/release/examples/stream_client"))
    parser.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    parser.add_argument("--promtool", default=shutil.which("promtool") or "")
    parser.add_argument("--model", default="", help="GGUF to serve (default: synthesize one)")
    parser.add_argument("--traffic-seconds", type=float, default=12.0,
                        help="seconds of requests (and 1s scrapes) before the queries")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()

    for path, what in [(args.civetta, "civetta binary"), (args.client, "stream_client example"),
                       (args.prometheus, "prometheus")]:
        if not Path(path).is_file():
            raise CheckFailed(f"no {what} at {path}")

    self_test_name_check()
    work = Path(tempfile.mkdtemp(prefix="civetta-prom-"))
    procs = Processes()
    stop = threading.Event()
    try:
        return run(args, work, procs, stop)
    finally:
        stop.set()
        procs.stop_all()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args, work: Path, procs: Processes, stop: threading.Event) -> int:
    grpc_port, metrics_port, prom_port = free_port(), free_port(), free_port()
    grpc_addr, metrics_addr, prom_addr = (f"127.0.0.1:{p}" for p in (grpc_port, metrics_port, prom_port))

    # Config and rules rewritten for the test: the daemon's port, 1s scrapes and evaluations.
    config = PROM_CONFIG.read_text()
    if SHIPPED_TARGET not in config:
        raise CheckFailed(f"{PROM_CONFIG} does not target {SHIPPED_TARGET}")
    config = config.replace(SHIPPED_TARGET, metrics_addr)
    config, n = re.subn(r"(scrape_interval|evaluation_interval):\s*\d+[smh]", r"\1: 1s", config)
    if n < 2:
        raise CheckFailed("could not rewrite the scrape/evaluation intervals")
    (work / "rules").mkdir()
    rules_files = sorted(RULES_DIR.glob("*.yml"))
    for path in rules_files:
        text = re.sub(r"(\binterval):\s*\d+[smh]", r"\1: 1s", path.read_text())
        (work / "rules" / path.name).write_text(text)
    (work / "prometheus.yml").write_text(config)

    if args.promtool:
        for argv in ([args.promtool, "check", "config", str(PROM_CONFIG)],
                     [args.promtool, "check", "rules", *map(str, rules_files)],
                     [args.promtool, "check", "config", str(work / "prometheus.yml")]):
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.returncode != 0:
                raise CheckFailed(f"{' '.join(argv)}:\n{res.stdout}{res.stderr}")
        log("promtool check config/rules: ok")
    else:
        log("promtool not found: skipping promtool checks")

    model = args.model
    if not model:
        model = str(work / "model.gguf")
        res = subprocess.run([args.civetta, "model", "synth", "--arch", "llama", "--quant", "q8_0",
                              "--seed", "1", "-o", model], capture_output=True, text=True)
        if res.returncode != 0:
            raise CheckFailed(f"civetta model synth failed:\n{res.stderr}")

    daemon = procs.start("civetta", [args.civetta, "serve", "--model", model, "--grpc-addr", grpc_addr,
                                     "--metrics-addr", metrics_addr, "--http-addr", ""], work / "civetta.log")
    try:
        wait_for(f"http://{metrics_addr}/metrics", 60, "civetta", daemon)
    except CheckFailed:
        print((work / "civetta.log").read_text()[-2000:], file=sys.stderr)
        raise
    prom = procs.start("prometheus", [args.prometheus, f"--config.file={work / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={work / 'data'}",
                                      f"--web.listen-address={prom_addr}", "--log.level=warn"],
                       work / "prometheus.log")
    try:
        wait_for(f"http://{prom_addr}/-/ready", 60, "prometheus", prom)
    except CheckFailed:
        print((work / "prometheus.log").read_text()[-2000:], file=sys.stderr)
        raise

    # The first scrape: up{job="civetta"} == 1.
    deadline = time.monotonic() + 30
    while True:
        up = query(prom_addr, 'up{job="civetta"}')
        result = up.get("data", {}).get("result", [])
        if up.get("status") == "success" and result and result[0]["value"][1] == "1":
            break
        if time.monotonic() > deadline:
            raise CheckFailed(f"Prometheus does not see the civetta target up after 30s: {up}")
        time.sleep(0.5)
    log("Prometheus scrapes civetta (up == 1)")

    counts = {"ok": 0, "failed": 0}
    thread = threading.Thread(target=traffic, args=(Path(args.client), grpc_addr, stop, counts), daemon=True)
    thread.start()
    log(f"traffic for {args.traffic_seconds:.0f}s while Prometheus scrapes every 1s")
    time.sleep(args.traffic_seconds)

    if counts["ok"] == 0:
        raise CheckFailed(f"no successful Generate request: {counts}")
    log(f"requests so far: {counts['ok']} ok, {counts['failed']} failed")

    _, scraped = http_get(f"http://{metrics_addr}/metrics")
    exported = scrape_names(scraped)
    dash = dashboard_queries()
    rules, records = rule_queries(rules_files)
    recorded_queries = [(f"recorded series {r}", r) for r in records]
    all_queries = dash + rules + recorded_queries

    errors, gpu_only = check_names(dash + rules, exported, set(records))
    if gpu_only:
        log(f"GPU-only metrics referenced (absent on the CPU backend, queries must still parse): {sorted(gpu_only)}")

    evaluated = empty_allowed = 0
    for where, raw in all_queries:
        expr = substitute_grafana_variables(raw)
        doc = query(prom_addr, expr)
        if doc.get("status") != "success":
            errors.append(f"{where}: Prometheus rejected the query ({doc.get('errorType')}: {doc.get('error')}): {expr}")
            continue
        evaluated += 1
        if numeric_samples(doc) > 0:
            continue
        names = names_in(raw)
        if names and names <= GPU_ONLY and not (names & exported):
            empty_allowed += 1  # a GPU-only panel on the CPU backend: parsed, no data expected
            continue
        errors.append(f"{where}: no data (no numeric sample): {expr}")

    stop.set()
    thread.join(timeout=130)
    log(f"queries: {len(all_queries)} ({len(dash)} dashboard, {len(rules)} rules, {len(records)} recorded series); "
        f"{evaluated} parsed, {empty_allowed} GPU-only empty on CPU; requests {counts['ok']} ok {counts['failed']} failed")
    if counts["failed"]:
        errors.append(f"{counts['failed']} Generate requests failed: {counts.get('last_error')}")
    if errors:
        for e in errors:
            print(f"FAIL {e}", file=sys.stderr)
        return 1
    log("PASS: every dashboard and rule query parses and returns data")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CheckFailed as err:
        print(f"prometheus-check: FAIL: {err}", file=sys.stderr)
        sys.exit(1)
