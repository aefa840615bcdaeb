//! A small gRPC client: streams a generation from a running civetta daemon.
//!
//!   cargo run --example stream_client -- --addr http://127.0.0.1:50051 --chat "Hello!"
//!   cargo run --example stream_client -- --prompt "The capital of France is" --max-tokens 32

use civetta::proto::{generate_response::Event, ChatMessage, GenerateRequest, SamplingParams};
use clap::Parser;
use std::io::Write;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    /// Raw prompt.
    #[arg(long)]
    prompt: Option<String>,
    /// One user message, rendered with the model's chat template on the server.
    #[arg(long)]
    chat: Option<String>,
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Bearer token, when the daemon requires one.
    #[arg(long, env = "CIVETTA_TOKEN")]
    token: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    match stream(Args::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line: the gRPC code and message, or the connection error.
            match e.downcast_ref::<tonic::Status>() {
                Some(s) => eprintln!("stream_client: {:?}: {}", s.code(), s.message()),
                None => eprintln!("stream_client: {}", e.chain().map(|c| c.to_string()).collect::<Vec<_>>().join(": ")),
            }
            std::process::ExitCode::FAILURE
        }
    }
}

async fn stream(a: Args) -> anyhow::Result<()> {
    let mut client = civetta::client::connect(&a.addr).await?;
    let mut req = GenerateRequest {
        prompt: a.prompt.clone().unwrap_or_default(),
        messages: a.chat.iter().map(|c| ChatMessage { role: "user".into(), content: c.clone() }).collect(),
        max_tokens: a.max_tokens,
        sampling: Some(SamplingParams { temperature: a.temperature, seed: Some(a.seed), ..Default::default() }),
        ..Default::default()
    };
    if req.prompt.is_empty() && req.messages.is_empty() {
        req.messages.push(ChatMessage { role: "user".into(), content: "Write one sentence about owls.".into() });
    }
    let mut request = tonic::Request::new(req);
    if let Some(t) = &a.token {
        request.metadata_mut().insert("authorization", format!("Bearer {t}").parse()?);
    }
    let mut stream = client.generate(request).await?.into_inner();
    let mut out = std::io::stdout();
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(Event::Token(t)) => {
                out.write_all(t.text.as_bytes())?;
                out.flush()?;
            }
            Some(Event::Done(d)) => {
                println!("{}", d.text_tail);
                let t = d.timings.unwrap_or_default();
                let u = d.usage.unwrap_or_default();
                eprintln!(
                    "[{} prompt + {} generated tokens; TTFT {:.1} ms, prefill {:.1} ms, decode {:.1} ms, finish {:?}]",
                    u.prompt_tokens,
                    u.completion_tokens,
                    t.time_to_first_token_seconds * 1e3,
                    t.prefill_seconds * 1e3,
                    t.decode_seconds * 1e3,
                    civetta::proto::FinishReason::try_from(d.finish_reason).unwrap_or_default()
                );
            }
            None => {}
        }
    }
    Ok(())
}
