//! A real `civetta serve` child process on ephemeral loopback ports, and helpers to talk
//! to it: a tonic client, /metrics scrapes parsed into samples, signals.
//! Include with `#[path = "common/daemon.rs"] mod daemon;` (after `mod common;`).
#![allow(dead_code)]

use civetta::proto::{generate_response::Event, inference_client::InferenceClient, GenerateDone, GenerateRequest, SamplingParams};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

pub struct Daemon {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub grpc: String,
    /// `127.0.0.1:PORT`
    pub metrics: String,
    /// `http://127.0.0.1:PORT`, the OpenAI-compatible HTTP API.
    pub http: String,
    stderr: Arc<Mutex<Vec<String>>>,
}

const START_TIMEOUT: Duration = Duration::from_secs(60);

impl Daemon {
    /// Starts `civetta serve --model MODEL` on port 0 for all endpoints, plus `extra` flags,
    /// and waits for its `listening grpc=... metrics=...` line.
    pub fn start(model: &Path, extra: &[&str]) -> Daemon {
        Self::start_env(model, extra, &[])
    }

    pub fn start_env(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut cmd = crate::common::civetta();
        cmd.args(["serve", "--model"])
            .arg(model)
            .args(["--grpc-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--threads", "2"])
            .args(extra)
            .env("CIVETTA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn civetta serve");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        let lines = stderr.clone();
        // Keeps draining stderr so the daemon never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if line.contains("listening grpc=") {
                    let _ = tx.send(line.clone());
                }
                lines.lock().unwrap().push(line);
            }
        });
        let line = match rx.recv_timeout(START_TIMEOUT) {
            Ok(l) => l,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("civetta serve did not start; stderr:\n{}", stderr.lock().unwrap().join("\n"));
            }
        };
        let grab =
            |k: &str| line.split_whitespace().find_map(|w| w.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} in {line:?}")).to_string();
        Daemon {
            grpc: format!("http://{}", grab("grpc=")),
            metrics: grab("metrics="),
            http: format!("http://{}", grab("http=")),
            child,
            stderr,
        }
    }

    pub async fn client(&self) -> InferenceClient<Channel> {
        InferenceClient::new(self.channel().await)
    }

    pub async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(self.grpc.clone()).unwrap().connect().await.expect("connect to the daemon")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM to the daemon (this child only, by pid).
    pub fn sigterm(&self) {
        // The shell's builtin kill: no dependency on a kill binary being installed.
        let ok = std::process::Command::new("sh").args(["-c", &format!("kill -TERM {}", self.child.id())]).status().unwrap().success();
        assert!(ok, "kill -TERM failed");
    }

    /// Waits for the daemon to exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(st) = self.child.try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// GET /metrics over a plain TCP connection; the body.
    pub fn scrape(&self) -> String {
        let (status, headers, body) = http_get(&self.metrics, "/metrics");
        assert_eq!(status, 200, "{headers}\n{body}");
        assert!(headers.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{headers}");
        body
    }

    pub fn samples(&self) -> Samples {
        Samples::parse(&self.scrape())
    }

    /// Polls /metrics until `pred` holds (counters are updated right after a stream's last
    /// message, so a scrape may race the final increment); panics with the last scrape.
    pub fn wait_metrics(&self, what: &str, pred: impl Fn(&Samples) -> bool) -> Samples {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.samples();
            if pred(&s) {
                return s;
            }
            if Instant::now() > end {
                panic!("metrics never satisfied: {what}\n{}", s.text);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 GET: (status, header block, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_string() };
    (status, head.to_string(), body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out += &rest[..n];
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One sample line of the Prometheus text format.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed /metrics scrape.
pub struct Samples {
    pub text: String,
    pub all: Vec<Sample>,
}

impl Samples {
    pub fn parse(text: &str) -> Samples {
        let all = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(parse_line).collect();
        Samples { text: text.to_string(), all }
    }

    /// Samples of `name` whose labels include all of `labels`.
    pub fn find<'a>(&'a self, name: &'a str, labels: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = &'a Sample> + 'a {
        self.all.iter().filter(move |s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
    }

    /// Sum over the matching samples (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).map(|s| s.value).sum()
    }

    /// The distinct values of `label` over the samples of `name`.
    pub fn label_values(&self, name: &str, label: &str) -> std::collections::BTreeSet<String> {
        self.find(name, &[]).filter_map(|s| s.labels.get(label).cloned()).collect()
    }
}

fn parse_line(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
    };
    let Some((name, rest)) = series.split_once('{') else {
        return Sample { name: series.to_string(), labels: BTreeMap::new(), value };
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let key = key.trim_start_matches(',').to_string();
        if key.is_empty() || key == "}" {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "bad labels in {line:?}");
        let mut v = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => v.push('\n'),
                    Some(o) => v.push(o),
                    None => break,
                },
                '"' => break,
                c => v.push(c),
            }
        }
        labels.insert(key, v);
        if chars.peek() == Some(&'}') {
            break;
        }
    }
    Sample { name: name.to_string(), labels, value }
}

/// A greedy, seeded request that ignores EOS (so it always yields `max_tokens` tokens).
pub fn greedy(prompt: &str, max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.into(),
        max_tokens,
        sampling: Some(SamplingParams { temperature: 0.0, seed: Some(7), ..Default::default() }),
        ignore_eos: true,
        ..Default::default()
    }
}

/// What one Generate stream delivered.
#[derive(Debug)]
pub struct Streamed {
    pub ids: Vec<u32>,
    pub text: String,
    pub done: GenerateDone,
}

/// Runs one Generate to the end; every stream must end with exactly one `done`.
pub async fn generate(
    client: &mut InferenceClient<Channel>,
    req: impl tonic::IntoRequest<GenerateRequest>,
) -> Result<Streamed, tonic::Status> {
    let mut s = client.generate(req).await?.into_inner();
    let (mut ids, mut text, mut done) = (Vec::new(), String::new(), None);
    while let Some(m) = s.message().await? {
        assert!(done.is_none(), "message after done");
        match m.event.expect("empty GenerateResponse") {
            Event::Token(t) => {
                ids.push(t.token_id);
                text += &t.text;
            }
            Event::Done(d) => {
                text += &d.text_tail;
                done = Some(d);
            }
        }
    }
    Ok(Streamed { ids, text, done: done.expect("stream ended without done") })
}

#[test]
fn sample_lines_parse() {
    let s = Samples::parse("# HELP x y\nfoo 3\nbar{a=\"1\",b=\"q\\\"x\"} 2.5\nbar{a=\"2\",b=\"\"} 1\n");
    assert_eq!(s.sum("foo", &[]), 3.0);
    assert_eq!(s.sum("bar", &[]), 3.5);
    assert_eq!(s.sum("bar", &[("b", "q\"x")]), 2.5);
    assert_eq!(s.label_values("bar", "a").into_iter().collect::<Vec<_>>(), ["1", "2"]);
}
