//! Soak test: a bounded load against the real `civetta serve` binary on loopback.
//!
//! Starts the daemon on a synthesised tiny model (`civetta model synth`), runs a warm-up,
//! reads the daemon's RSS (VmRSS in /proc/PID/status), then runs `--requests` Generate
//! streams, `--concurrency` at a time, with a random mix of complete streams (greedy and
//! sampled, stop sequences, chat), streams dropped mid-flight, gRPC deadlines that expire,
//! and a few invalid requests. The daemon's queue is smaller than the concurrency, so
//! RESOURCE_EXHAUSTED is provoked too. Afterwards it checks:
//! - every stream ended properly: one `done` as the last message with the promised token
//!   count, or an expected status (CANCELLED / DEADLINE_EXCEEDED for deadline requests,
//!   RESOURCE_EXHAUSTED at admission, INVALID_ARGUMENT for the invalid ones), nothing else;
//! - the daemon's gauges are back to 0 (`civetta_active_sequences`, `civetta_queue_depth`,
//!   `civetta_requests_in_flight`, `civetta_kv_cache_bytes`) and its counters agree with
//!   what the client saw;
//! - RSS after the run is within `--rss-tolerance` (10%) of RSS after the warm-up;
//! - SIGTERM then stops the daemon with exit code 0.
//!
//! Prints a summary (requests, outcomes by code, RSS warm/after, p50/p99 latency) and exits
//! 1 when a check fails. `make soak` runs 2,000 requests; CI runs `make soak SOAK_REQUESTS=300`.

use civetta::proto::{
    generate_response::Event, inference_client::InferenceClient, ChatMessage, FinishReason, GenerateRequest, SamplingParams,
};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::Code;

#[derive(Debug, Clone)]
struct Opts {
    civetta: PathBuf,
    model: Option<PathBuf>,
    requests: usize,
    concurrency: usize,
    warmup: usize,
    seed: u64,
    rss_tolerance: f64,
    max_active: usize,
    max_queue: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: soak [--civetta PATH] [--model FILE.gguf] [--requests N] [--concurrency N] [--warmup N] [--seed N]\n\
         \x20           [--rss-tolerance FRACTION] [--max-active N] [--max-queue N]"
    );
    std::process::exit(2)
}

fn parse_args() -> Opts {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/soak -> target/<profile>/civetta
    let sibling = exe.parent().and_then(|p| p.parent()).map(|p| p.join("civetta")).unwrap_or_else(|| "civetta".into());
    let mut o = Opts {
        civetta: sibling,
        model: None,
        requests: 2000,
        concurrency: 16,
        warmup: 0,
        seed: 1,
        rss_tolerance: 0.10,
        max_active: 4,
        max_queue: 10,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut v = || args.next().unwrap_or_else(|| usage());
        let num = |s: String| s.parse::<usize>().unwrap_or_else(|_| usage());
        match a.as_str() {
            "--civetta" => o.civetta = v().into(),
            "--model" => o.model = Some(v().into()),
            "--requests" => o.requests = num(v()),
            "--concurrency" => o.concurrency = num(v()).max(1),
            "--warmup" => o.warmup = num(v()),
            "--seed" => o.seed = num(v()) as u64,
            "--rss-tolerance" => o.rss_tolerance = v().parse().unwrap_or_else(|_| usage()),
            "--max-active" => o.max_active = num(v()),
            "--max-queue" => o.max_queue = num(v()),
            _ => usage(),
        }
    }
    if o.warmup == 0 {
        o.warmup = (o.requests / 10).clamp(200, 400);
    }
    o
}

/// The daemon child process; killed on drop unless it already exited.
struct Daemon {
    child: Child,
    grpc: String,
    metrics: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn start(o: &Opts, model: &std::path::Path) -> Daemon {
        let mut child = Command::new(&o.civetta)
            .args(["serve", "--model"])
            .arg(model)
            .args(["--grpc-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--http-addr", "", "--threads", "2", "--context", "512"])
            .args(["--max-active", &o.max_active.to_string(), "--max-queue", &o.max_queue.to_string(), "--shutdown-grace", "5"])
            .env("CIVETTA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", o.civetta.display()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains("listening grpc=") {
                    let _ = tx.send(line.clone());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let Ok(line) = rx.recv_timeout(Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("civetta serve did not start:\n{}", stderr.lock().unwrap().join("\n"));
        };
        let grab = |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).expect("address in the listening line").to_string();
        Daemon { grpc: format!("http://{}", grab("grpc=")), metrics: grab("metrics="), child, stderr }
    }

    fn rss_kib(&self) -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("/proc/PID/status");
        s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).expect("VmRSS")
    }

    /// Sum of the samples of `name` whose label block contains every `k="v"` in `labels`.
    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let body = http_get(&self.metrics, "/metrics");
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(series, _)| {
                let (n, rest) = series.split_once('{').unwrap_or((series, ""));
                n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
            .filter_map(|(_, v)| v.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    if !head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        return body.to_string();
    }
    let (mut rest, mut out) = (body, String::new());
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out += &tail[..n];
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

/// xorshift64*: a seeded generator with no extra dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: &[&str] = &[
    "the", "owl", "river", "stone", "quietly", "under", "a", "bright", "morning", "engine", "token", "cache", "small", "garden", "wrote",
    "over", "light", "7", "42", "é", "🦉", "code", "fn", "main()", "{", "}", "and", "then",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Complete,
    Cancel,
    Deadline,
    Invalid,
}

/// The outcome of one request, as a label for the summary ("OK", a gRPC code name, or
/// "DROPPED" for a stream the client dropped itself), or a failure description.
type Outcome = Result<&'static str, String>;

fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::AlreadyExists => "ALREADY_EXISTS",
    }
}

/// One request of the mix, chosen by `rng`; returns its outcome.
/// `rejections` counts the RESOURCE_EXHAUSTED answers that were retried.
async fn one(client: &mut InferenceClient<Channel>, rng: &mut Rng, rejections: &mut usize) -> Outcome {
    let kind = match rng.below(100) {
        0..=59 => Kind::Complete,
        60..=81 => Kind::Cancel,
        82..=96 => Kind::Deadline,
        _ => Kind::Invalid,
    };
    let n_words = 1 + rng.below(24) as usize;
    let prompt: Vec<&str> = (0..n_words).map(|_| WORDS[rng.below(WORDS.len() as u64) as usize]).collect();
    let prompt = prompt.join(" ");
    let sampling = if rng.below(2) == 0 {
        SamplingParams { temperature: 0.0, seed: Some(rng.next()), ..Default::default() }
    } else {
        SamplingParams { temperature: 0.9, top_p: 0.9, top_k: 40, seed: Some(rng.next()), ..Default::default() }
    };
    let mut req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens: 1 + rng.below(40) as u32,
        sampling: Some(sampling),
        ignore_eos: rng.below(4) != 0,
        ..Default::default()
    };
    if rng.below(6) == 0 {
        req.stop = vec!["the".into(), "\n\n".into()];
    }
    if rng.below(8) == 0 {
        req.prompt.clear();
        req.messages = vec![ChatMessage { role: "user".into(), content: prompt }];
    }
    let (mut cancel_after, mut timeout) = (None, None);
    match kind {
        Kind::Complete => {}
        Kind::Cancel => {
            req.max_tokens = 200;
            cancel_after = Some(rng.below(12) as usize);
        }
        Kind::Deadline => {
            req.max_tokens = 400;
            req.ignore_eos = true;
            timeout = Some(Duration::from_millis(20 + rng.below(300)));
        }
        Kind::Invalid => match rng.below(3) {
            0 => req.max_tokens = 0,
            1 => req.sampling = Some(SamplingParams { top_p: 1.5, ..Default::default() }),
            _ => req.model = "no-such-model".into(),
        },
    }
    let expected_tokens = (kind == Kind::Complete && req.ignore_eos && req.stop.is_empty()).then_some(req.max_tokens as usize);
    // RESOURCE_EXHAUSTED (the queue is full): back off a little and retry, as a client should.
    let mut attempts = 0;
    let mut stream = loop {
        let mut request = tonic::Request::new(req.clone());
        if let Some(t) = timeout {
            request.set_timeout(t);
        }
        match client.generate(request).await {
            Ok(r) => break r.into_inner(),
            Err(s) if s.code() == Code::ResourceExhausted && attempts < 100 => {
                if s.metadata().get("retry-after-ms").is_none() {
                    return Err(format!("RESOURCE_EXHAUSTED without a retry hint: {s:?}"));
                }
                *rejections += 1;
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50 + rng.below(200))).await;
            }
            Err(s) => return status_outcome(kind, &s),
        }
    };
    // A stream dropped before its first message, now and then.
    if cancel_after == Some(0) {
        return Ok("DROPPED");
    }
    let mut tokens = 0usize;
    loop {
        match stream.message().await {
            Ok(Some(m)) => match m.event {
                Some(Event::Token(_)) => {
                    tokens += 1;
                    if cancel_after == Some(tokens) {
                        return Ok("DROPPED");
                    }
                }
                Some(Event::Done(d)) => {
                    if let Ok(Some(extra)) = stream.message().await {
                        return Err(format!("a message after done: {extra:?}"));
                    }
                    let usage = d.usage.unwrap_or_default();
                    if usage.completion_tokens as usize != tokens || d.token_ids.len() != tokens {
                        return Err(format!("done says {} tokens, {tokens} streamed", usage.completion_tokens));
                    }
                    if let Some(n) = expected_tokens {
                        if tokens != n || d.finish_reason != FinishReason::Length as i32 {
                            return Err(format!("expected {n} tokens and LENGTH, got {tokens} and {:?}", d.finish_reason));
                        }
                    }
                    return match kind {
                        Kind::Invalid => Err("an invalid request was served".into()),
                        _ => Ok("OK"),
                    };
                }
                None => return Err("an empty GenerateResponse".into()),
            },
            Ok(None) => return Err(format!("the stream ended after {tokens} tokens without done or status")),
            Err(s) => return status_outcome(kind, &s),
        }
    }
}

fn status_outcome(kind: Kind, s: &tonic::Status) -> Outcome {
    let expected = match s.code() {
        Code::ResourceExhausted => kind != Kind::Invalid,
        Code::DeadlineExceeded | Code::Cancelled => kind == Kind::Deadline,
        // A bad value is INVALID_ARGUMENT; an unknown model name is NOT_FOUND (gRPC conventions).
        Code::InvalidArgument | Code::NotFound => kind == Kind::Invalid,
        _ => false,
    };
    if expected {
        Ok(code_name(s.code()))
    } else {
        Err(format!("{kind:?} request: unexpected {:?}: {}", s.code(), s.message()))
    }
}

#[derive(Default)]
struct Tally {
    outcomes: BTreeMap<&'static str, usize>,
    failures: Vec<String>,
    /// Wall time of the requests that completed with done.
    latencies: Vec<Duration>,
}

/// Runs `n` requests with `concurrency` workers sharing one HTTP/2 channel per worker pair.
async fn run_load(grpc: &str, n: usize, concurrency: usize, seed: u64) -> Tally {
    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut workers = Vec::new();
    for w in 0..concurrency {
        let channel = tonic::transport::Endpoint::from_shared(grpc.to_string()).unwrap().connect().await.expect("connect");
        let mut client = InferenceClient::new(channel);
        let (next, tally) = (next.clone(), tally.clone());
        workers.push(tokio::spawn(async move {
            let mut rng = Rng((seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (w as u64 + 1).wrapping_mul(0xd1b5_4a32_d192_ed03)) | 1);
            while next.fetch_add(1, Ordering::SeqCst) < n {
                let t0 = Instant::now();
                let mut rejections = 0;
                let outcome = one(&mut client, &mut rng, &mut rejections).await;
                let mut t = tally.lock().unwrap();
                if rejections > 0 {
                    *t.outcomes.entry("RESOURCE_EXHAUSTED (retried)").or_default() += rejections;
                }
                match outcome {
                    Ok(label) => {
                        *t.outcomes.entry(label).or_default() += 1;
                        if label == "OK" {
                            t.latencies.push(t0.elapsed());
                        }
                    }
                    Err(e) => t.failures.push(e),
                }
            }
        }));
    }
    for w in workers {
        w.await.expect("worker panicked");
    }
    Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let o = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = o.model.clone().unwrap_or_else(|| {
        let p = dir.path().join("soak-llama-q8_0.gguf");
        let st = Command::new(&o.civetta)
            .args(["model", "synth", "--arch", "llama", "--quant", "q8_0", "--seed", "1", "-o"])
            .arg(&p)
            .status()
            .expect("civetta model synth");
        assert!(st.success(), "civetta model synth failed");
        p
    });
    let t_start = Instant::now();
    let mut d = Daemon::start(&o, &model);
    let rss_start = d.rss_kib();
    let warm = rt.block_on(run_load(&d.grpc, o.warmup, o.concurrency, o.seed ^ 0xabcdef));
    let mut failures: Vec<String> = warm.failures.iter().map(|f| format!("warm-up: {f}")).collect();
    let settle = |d: &Daemon, what: &str| {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let busy: Vec<(&str, f64)> =
                ["civetta_active_sequences", "civetta_queue_depth", "civetta_requests_in_flight", "civetta_kv_cache_bytes"]
                    .into_iter()
                    .map(|m| (m, d.metric(m, &[])))
                    .filter(|(_, v)| *v != 0.0)
                    .collect();
            if busy.is_empty() {
                return None;
            }
            if Instant::now() > end {
                return Some(format!("{what}: gauges not back to 0 after 20 s: {busy:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    failures.extend(settle(&d, "after warm-up"));
    let rss_warm = d.rss_kib();

    let t0 = Instant::now();
    let mut t = rt.block_on(run_load(&d.grpc, o.requests, o.concurrency, o.seed));
    let elapsed = t0.elapsed();
    failures.append(&mut t.failures);
    failures.extend(settle(&d, "after the run"));
    let rss_after = d.rss_kib();
    let rss_peak = std::fs::read_to_string(format!("/proc/{}/status", d.child.id()))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok()))
        .unwrap_or(0);
    let drift = (rss_after as f64 - rss_warm as f64) / rss_warm as f64;
    if drift.abs() > o.rss_tolerance {
        failures.push(format!("RSS {rss_warm} KiB after warm-up, {rss_after} KiB after the run ({:+.1}%)", drift * 100.0));
    }

    // The daemon's view must agree with the client's (warm-up included).
    let count = |t: &Tally, label: &str| t.outcomes.get(label).copied().unwrap_or(0);
    let total = |label: &str| {
        let retried = if label == "RESOURCE_EXHAUSTED" {
            count(&warm, "RESOURCE_EXHAUSTED (retried)") + count(&t, "RESOURCE_EXHAUSTED (retried)")
        } else {
            0
        };
        count(&warm, label) + count(&t, label) + retried
    };
    let server = |code: &str| d.metric("civetta_requests_total", &[("rpc", "Generate"), ("code", code)]) as usize;
    // A stream the client drops, or whose deadline fires, just as the daemon sends its last
    // message is complete for the daemon (OK) but not for the client: OK may exceed the
    // client's count by at most those streams (a race of one message, seen in CI once in
    // many runs), never fall short of it. The other codes must agree exactly.
    let racing = total("DROPPED") + total("DEADLINE_EXCEEDED");
    for code in ["OK", "RESOURCE_EXHAUSTED", "INVALID_ARGUMENT"] {
        let slack = if code == "OK" { racing } else { 0 };
        let agrees = |n: usize| n >= total(code) && n <= total(code) + slack;
        // A stream's counter moves just after its last message: allow a moment.
        let end = Instant::now() + Duration::from_secs(5);
        while !agrees(server(code)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !agrees(server(code)) {
            failures.push(format!(
                "daemon counted {} Generate {code}, the client saw {} (+ at most {slack} streams it dropped or timed out as the daemon finished them)",
                server(code),
                total(code)
            ));
        }
    }
    for code in ["UNKNOWN", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"] {
        if server(code) != 0 {
            failures.push(format!("daemon counted {} Generate {code}", server(code)));
        }
    }
    let generated = d.metric("civetta_generated_tokens_total", &[]);

    // Finally a clean SIGTERM: exit 0.
    let pid = d.child.id();
    let _ = Command::new("sh").args(["-c", &format!("kill -TERM {pid}")]).status();
    let end = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(st) = d.child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > end {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    match exit {
        Some(st) if st.success() => {}
        other => failures.push(format!("after SIGTERM: {other:?}")),
    }
    let log = d.stderr.lock().unwrap().clone();
    for l in log.iter().filter(|l| l.contains("panicked") || l.contains("ERROR")) {
        failures.push(format!("daemon log: {l}"));
    }

    t.latencies.sort();
    let outcomes: Vec<String> = t.outcomes.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "soak: {} requests (+{} warm-up), concurrency {}, {:.1}s ({:.1} req/s), {generated:.0} tokens generated in all",
        o.requests,
        o.warmup,
        o.concurrency,
        elapsed.as_secs_f64(),
        o.requests as f64 / elapsed.as_secs_f64()
    );
    println!("soak: outcomes {} (DROPPED = client dropped the stream mid-flight)", outcomes.join(" "));
    println!(
        "soak: RSS start {:.1} MiB, after warm-up {:.1} MiB, after the run {:.1} MiB ({:+.1}%), peak {:.1} MiB",
        rss_start as f64 / 1024.0,
        rss_warm as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        drift * 100.0,
        rss_peak as f64 / 1024.0
    );
    println!(
        "soak: latency of completed streams ({}): p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        t.latencies.len(),
        percentile(&t.latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&t.latencies, 0.99).as_secs_f64() * 1e3,
        t.latencies.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
    println!("soak: total {:.1}s", t_start.elapsed().as_secs_f64());
    if failures.is_empty() {
        println!(
            "soak: ok (every stream ended with done or an expected status; gauges back to 0; RSS within {:.0}%)",
            o.rss_tolerance * 100.0
        );
    } else {
        println!("soak: FAILED, {} problems:", failures.len());
        for f in failures.iter().take(30) {
            println!("  {f}");
        }
        std::process::exit(1);
    }
}
