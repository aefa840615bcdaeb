//! The OpenAI-compatible HTTP API against a real `civetta serve` on the real default model
//! (SmolLM2-135M-Instruct; it has the chat template the chat endpoint needs):
//!
//! - the same greedy request over HTTP and gRPC yields the same token ids, text and usage,
//!   for chat and completions, streamed and not;
//! - tests/python/openai_api_check.py drives it with the official `openai` package:
//!   streaming, stop sequences, seeds, logprobs, every error status, cancellation.
//!
//! Needs models/smollm2-135m-instruct-q4_1.gguf (installed through scripts/fetch-smollm2.sh if absent);
//! the python part needs `pip install openai` (scripts/test-deps.sh) unless CIVETTA_SKIP_PYTHON=1.

mod common;
#[path = "common/daemon.rs"]
mod daemon;

use civetta::proto::{ChatMessage, GenerateRequest, SamplingParams};
use daemon::Daemon;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::Command;

const TOKENS: u32 = 16;

fn real_model() -> Option<PathBuf> {
    Some(common::smollm2())
}

fn post(url: &str, body: &Value) -> (u16, String) {
    let r = reqwest::blocking::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(std::time::Duration::from_secs(300))
        .send()
        .expect("HTTP request");
    (r.status().as_u16(), r.text().unwrap())
}

/// What one HTTP generation delivered: ids (llama.cpp's `return_tokens`), text, usage.
#[derive(Debug, PartialEq)]
struct Answer {
    ids: Vec<u32>,
    text: String,
    prompt_tokens: u64,
    completion_tokens: u64,
}

/// The text of a choice or chunk: chat `message`/`delta` content, or completions `text`.
fn choice_text(c: &Value) -> &str {
    c["message"]["content"].as_str().or(c["delta"]["content"].as_str()).or(c["text"].as_str()).unwrap_or("")
}

fn ids_of(c: &Value) -> Vec<u32> {
    c["tokens"].as_array().map(|a| a.iter().map(|x| x.as_u64().unwrap() as u32).collect()).unwrap_or_default()
}

fn usage(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    assert_eq!(u["total_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()));
    (u["prompt_tokens"].as_u64().unwrap(), u["completion_tokens"].as_u64().unwrap())
}

fn http_once(url: &str, body: &Value) -> Answer {
    let (status, text) = post(url, body);
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    let c = &v["choices"][0];
    let (prompt_tokens, completion_tokens) = usage(&v);
    Answer { ids: ids_of(c), text: choice_text(c).to_string(), prompt_tokens, completion_tokens }
}

fn http_streamed(url: &str, body: &Value) -> Answer {
    let mut body = body.clone();
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = post(url, &body);
    assert_eq!(status, 200, "{text}");
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let mut a = Answer { ids: Vec::new(), text: String::new(), prompt_tokens: 0, completion_tokens: 0 };
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data line: {e:?}"))).unwrap();
        match v["choices"].as_array().unwrap().first() {
            Some(c) => {
                a.ids.extend(ids_of(c));
                a.text += choice_text(c);
            }
            None => (a.prompt_tokens, a.completion_tokens) = usage(&v),
        }
    }
    a
}

fn grpc(d: &Daemon, req: GenerateRequest) -> Answer {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let s = rt.block_on(async {
        let mut client = d.client().await;
        daemon::generate(&mut client, req).await.expect("gRPC Generate")
    });
    let u = s.done.usage.unwrap();
    Answer { ids: s.ids, text: s.text, prompt_tokens: u.prompt_tokens as u64, completion_tokens: u.completion_tokens as u64 }
}

#[test]
fn greedy_requests_agree_between_http_and_grpc() {
    let Some(model) = real_model() else { return };
    let d = Daemon::start(&model, &[]);
    let greedy = Some(SamplingParams { temperature: 0.0, seed: Some(7), ..Default::default() });

    let content = "Write one sentence about owls.";
    let want = grpc(
        &d,
        GenerateRequest {
            messages: vec![ChatMessage { role: "user".into(), content: content.into() }],
            max_tokens: TOKENS,
            sampling: greedy,
            ignore_eos: true,
            ..Default::default()
        },
    );
    assert_eq!(want.ids.len(), TOKENS as usize);
    let body = json!({"messages": [{"role": "user", "content": content}], "max_tokens": TOKENS, "temperature": 0, "seed": 7,
                      "ignore_eos": true, "return_tokens": true});
    let url = format!("{}/v1/chat/completions", d.http);
    assert_eq!(http_once(&url, &body), want, "chat, one response");
    assert_eq!(http_streamed(&url, &body), want, "chat, streamed");

    let prompt = "The capital of France is";
    let want =
        grpc(&d, GenerateRequest { prompt: prompt.into(), max_tokens: TOKENS, sampling: greedy, ignore_eos: true, ..Default::default() });
    let body = json!({"prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": true, "return_tokens": true});
    let url = format!("{}/v1/completions", d.http);
    assert_eq!(http_once(&url, &body), want, "completion, one response");
    assert_eq!(http_streamed(&url, &body), want, "completion, streamed");

    // Both APIs counted in the same metric families, HTTP under its routes.
    let s = d.samples();
    assert_eq!(s.sum("civetta_requests_total", &[("rpc", "/v1/chat/completions"), ("code", "OK")]), 2.0, "{}", s.text);
    assert_eq!(s.sum("civetta_requests_total", &[("rpc", "/v1/completions"), ("code", "OK")]), 2.0);
    assert_eq!(s.sum("civetta_requests_total", &[("rpc", "Generate"), ("code", "OK")]), 2.0);
}

#[test]
fn openai_python_client() {
    let Some(model) = real_model() else { return };
    if std::env::var("CIVETTA_SKIP_PYTHON").as_deref() == Ok("1") {
        eprintln!("skipping: CIVETTA_SKIP_PYTHON=1");
        return;
    }
    let probe = Command::new("python3").args(["-c", "import openai"]).status().map(|s| s.success()).unwrap_or(false);
    assert!(probe, "needs python3 with the openai package (scripts/test-deps.sh; pip install openai), or CIVETTA_SKIP_PYTHON=1");
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "test-token-19\n").unwrap();
    let max_body = 65536;
    let d = Daemon::start_env(
        &model,
        &["--auth-token-file", token_file.to_str().unwrap(), "--max-active", "1", "--max-queue", "0", "--shutdown-grace", "120"],
        &[("CIVETTA_SERVER__MAX_MESSAGE_BYTES", &max_body.to_string()), ("CIVETTA_MODEL__NAME", "smol")],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_api_check.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--base-url", &format!("{}/v1", d.http), "--metrics", &d.metrics, "--token", "test-token-19"])
        .args(["--model", "smol", "--pid", &d.pid().to_string(), "--max-body", &max_body.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "openai_api_check.py failed\n{stdout}\n{stderr}\ndaemon:\n{}", d.stderr());
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

/// HTTP request time limits (server.http_request_timeout_seconds, and a request's own
/// `timeout`, which can only shorten it): past the limit the generation is cancelled and the
/// client gets 504 `deadline_exceeded` (streaming: an SSE error event ends the stream),
/// counted as DEADLINE_EXCEEDED; requests that finish in time are untouched. Synthetic model.
#[test]
fn requests_past_their_time_limit_get_504_and_free_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::synth(dir.path(), "llama", "q8_0");
    let d = Daemon::start(&model, &["--context", "2048", "--http-request-timeout", "0.2"]);
    let url = format!("{}/v1/completions", d.http);
    let long = |extra: Value| {
        let mut b = json!({"prompt": "on and on", "max_tokens": 2000, "temperature": 0, "ignore_eos": true});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let t = std::time::Instant::now();
    let (status, body) = post(&url, &long(json!({})));
    let took = t.elapsed();
    assert_eq!(status, 504, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "deadline_exceeded", "{body}");
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
    // The request's own, shorter limit; streamed: the error arrives as the last event.
    let (status, body) = post(&url, &long(json!({"timeout": 0.1, "stream": true})));
    assert_eq!(status, 200, "{body}");
    let last = body.lines().rfind(|l| l.starts_with("data: ")).unwrap();
    assert!(last.contains("deadline_exceeded") && !body.contains("[DONE]"), "{last}");
    // A longer `timeout` than the server's does not extend it; a short request is served.
    assert_eq!(post(&url, &long(json!({"timeout": 60}))).0, 504);
    let (status, body) = post(&url, &json!({"prompt": "short", "max_tokens": 2, "temperature": 0, "timeout": 30}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(post(&url, &json!({"prompt": "x", "timeout": -1})).0, 400);
    let m = d.wait_metrics("cancelled sequences freed", |m| m.sum("civetta_active_sequences", &[]) == 0.0);
    assert_eq!(m.sum("civetta_requests_total", &[("rpc", "/v1/completions"), ("code", "DEADLINE_EXCEEDED")]), 3.0, "{}", m.text);
    assert!(m.sum("civetta_generated_tokens_total", &[]) < 3.0 * 2000.0);
}
