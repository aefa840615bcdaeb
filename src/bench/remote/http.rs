//! Benchmark streams over the OpenAI-compatible HTTP API: `POST /v1/completions` with
//! `stream: true`, read as Server-Sent Events.
//!
//! The request is the gRPC one in OpenAI's words: the same raw prompt (`/v1/completions`, not
//! chat, so no template is applied), `max_tokens`, temperature 0, seed 1, and the extensions
//! `ignore_eos` and `return_tokens` (llama.cpp's; each chunk lists the token ids it carries, so a
//! chunk holding several tokens counts as several). A server that does not send `tokens`
//! has each chunk with text counted as one token; the total comes from
//! `stream_options.include_usage` either way.

use super::stream::{Delivery, StreamControl, StreamRecord, StreamRequest};
use std::time::Instant;

#[derive(Clone)]
pub struct HttpTarget {
    client: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    pub base: String,
    /// The served model's id (the first of `GET /v1/models`).
    pub model: String,
    token: Option<String>,
}

impl HttpTarget {
    pub async fn connect(base: &str, token: Option<&str>) -> anyhow::Result<HttpTarget> {
        let base = if base.contains("://") { base.to_string() } else { format!("http://{base}") };
        let base = base.trim_end_matches('/').trim_end_matches("/v1").to_string();
        let client = reqwest::Client::new();
        let mut t = HttpTarget { client, base, model: String::new(), token: token.map(str::to_string) };
        let resp = t.get("/v1/models").send().await.map_err(|e| {
            if e.is_connect() {
                anyhow::anyhow!("no OpenAI-compatible API at {}: start the daemon with `--http-addr` (or `civetta serve`)", t.base)
            } else {
                anyhow::anyhow!("GET {}/v1/models: {e}", t.base)
            }
        })?;
        let status = resp.status();
        let body = resp.text().await?;
        anyhow::ensure!(status.is_success(), "GET {}/v1/models: {status}: {body}", t.base);
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| anyhow::anyhow!("GET {}/v1/models: {e}", t.base))?;
        t.model =
            v["data"][0]["id"].as_str().ok_or_else(|| anyhow::anyhow!("GET {}/v1/models lists no model: {body}", t.base))?.to_string();
        Ok(t)
    }

    fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.auth(self.client.get(format!("{}{path}", self.base)))
    }

    fn auth(&self, b: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.token {
            Some(t) => b.bearer_auth(t),
            None => b,
        }
    }

    pub fn body(&self, req: &StreamRequest) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.max_tokens,
            "temperature": 0.0,
            "seed": 1,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
            "return_tokens": true,
        })
    }

    pub async fn stream(&self, req: &StreamRequest, mut ctl: StreamControl) -> StreamRecord {
        let builder = self
            .auth(self.client.post(format!("{}/v1/completions", self.base)))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body(req).to_string());
        let sent = Instant::now();
        let mut resp = match builder.send().await {
            Ok(r) => r,
            Err(e) => return StreamRecord::failed(sent, format!("POST /v1/completions: {e}")),
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return StreamRecord::failed(sent, format!("POST /v1/completions: {status}: {body}"));
        }
        let mut record = StreamRecord::new(sent);
        let mut sse = SseParser::default();
        loop {
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                _ = ctl.stopped() => {
                    record.cancelled = true;
                    return record;
                }
            };
            let bytes = match chunk {
                Ok(Some(b)) => b,
                Ok(None) => {
                    record.error.get_or_insert_with(|| "the stream ended without `data: [DONE]`".into());
                    return record;
                }
                Err(e) => {
                    record.error = Some(format!("reading the stream: {e}"));
                    return record;
                }
            };
            let at = Instant::now();
            for data in sse.push(&bytes) {
                match read_event(&data) {
                    Event::Tokens(n) if n > 0 => ctl.record(&mut record, Delivery { at, tokens: n }),
                    Event::Tokens(_) => {}
                    Event::Usage { prompt, completion } => {
                        record.prompt_tokens = Some(prompt);
                        record.completion_tokens = Some(completion);
                    }
                    Event::Done => return record,
                    Event::Error(e) => {
                        record.error = Some(e);
                        return record;
                    }
                }
            }
        }
    }
}

/// What one `data:` payload of a completions stream means to the benchmark.
#[derive(Debug, PartialEq)]
pub enum Event {
    /// A chunk and the number of generated tokens it carries (0: role/finish chunks).
    Tokens(usize),
    Usage {
        prompt: usize,
        completion: usize,
    },
    Done,
    Error(String),
}

pub fn read_event(data: &str) -> Event {
    if data.trim() == "[DONE]" {
        return Event::Done;
    }
    let v: serde_json::Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => return Event::Error(format!("not JSON in the stream ({e}): {data}")),
    };
    if let Some(e) = v.get("error") {
        return Event::Error(e["message"].as_str().map(str::to_string).unwrap_or_else(|| e.to_string()));
    }
    // The include_usage chunk has no choices; a server may also put usage on the last chunk.
    let usage = v.get("usage").filter(|u| u.is_object());
    let choice = v["choices"].get(0);
    let tokens = choice.map_or(0, |c| match c["tokens"].as_array() {
        Some(ids) => ids.len(),
        None => {
            let text = c["text"].as_str().or(c["delta"]["content"].as_str()).unwrap_or("");
            usize::from(!text.is_empty())
        }
    });
    match usage {
        Some(u) if tokens == 0 => Event::Usage {
            prompt: u["prompt_tokens"].as_u64().unwrap_or(0) as usize,
            completion: u["completion_tokens"].as_u64().unwrap_or(0) as usize,
        },
        _ => Event::Tokens(tokens),
    }
}

/// Splits a byte stream into Server-Sent Events and returns their `data` (multi-line data joined
/// with newlines; comments and other fields ignored), across any split of the bytes.
#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
}

impl SseParser {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        // CR, LF and CRLF all end lines; JSON data never holds a raw CR, so dropping CRs
        // leaves LF-only text.
        self.buf.extend(bytes.iter().filter(|&&b| b != b'\r'));
        let mut out = Vec::new();
        while let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
            let block: Vec<u8> = self.buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&block[..end]);
            let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data:")).map(|d| d.strip_prefix(' ').unwrap_or(d)).collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_split_of_the_bytes() {
        let stream = b": keep-alive\r\n\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: one\ndata:two\n\ndata: [DONE]\n\n";
        for split in 0..stream.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&stream[..split]);
            got.extend(p.push(&stream[split..]));
            assert_eq!(got, ["{\"a\":1}", "one\ntwo", "[DONE]"], "split at {split}");
        }
    }

    #[test]
    fn chunks_count_their_token_ids_and_usage_is_read() {
        let chunk = |s: &str| read_event(s);
        assert_eq!(chunk(r#"{"choices":[{"index":0,"text":"ab","tokens":[5,6]}]}"#), Event::Tokens(2));
        assert_eq!(chunk(r#"{"choices":[{"index":0,"text":"a"}]}"#), Event::Tokens(1));
        assert_eq!(chunk(r#"{"choices":[{"index":0,"delta":{"content":"a"}}]}"#), Event::Tokens(1));
        assert_eq!(chunk(r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}]}"#), Event::Tokens(0));
        assert_eq!(
            chunk(r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}"#),
            Event::Usage { prompt: 7, completion: 9 }
        );
        assert_eq!(chunk("[DONE]"), Event::Done);
        assert_eq!(chunk(r#"{"error":{"message":"deadline","type":"x"}}"#), Event::Error("deadline".into()));
        assert!(matches!(chunk("{nope"), Event::Error(_)));
    }
}
