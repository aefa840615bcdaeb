//! The `civetta` command line.

use anyhow::Context;
use civetta::engine::{ChatMessage, Engine, EngineConfig, GenerationEvent, GenerationRequest, PromptInput, SamplingParams};
use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "civetta", version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("CIVETTA_GIT_SHA"), ")"), about = "Inference daemon for AMD Strix Halo: GGUF models over gRPC, with per-kernel metrics")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a model over gRPC, with Prometheus metrics on a second port.
    Serve(civetta::server::ServeArgs),
    /// Generate once and print tokens as they come.
    Generate(GenerateArgs),
    /// Show a GGUF file's metadata and tensor table.
    Info(InfoArgs),
    /// Model files: `synth` writes a synthetic test model.
    Model {
        #[command(subcommand)]
        cmd: ModelCmd,
    },
    /// Print the environment fingerprint (host, IOMMU, container, toolchain, GPU).
    Env(civetta::envinfo::cli::EnvArgs),
    /// Static resource report (VGPRs, scratch, spills, occupancy) of compiled GPU kernels.
    Kernels(civetta::kernels::cli::KernelsArgs),
    /// Benchmark prompt processing and generation (llama-bench-like), with hashes and profile.
    Bench(civetta::bench::cli::BenchArgs),
    /// Compare two `civetta bench -o json` reports.
    Compare(civetta::bench::cli::CompareArgs),
    /// Reproduce a bench across layers (host, podman, toolbox) and boots (IOMMU modes).
    Repro {
        #[command(subcommand)]
        cmd: civetta::repro::cli::ReproCmd,
    },
    /// Print the logits of every position of a token sequence as JSON (reference tests).
    Logits(LogitsArgs),
    /// Tokenize text with a model's tokenizer.
    Tokenize(TokenizeArgs),
}

#[derive(Subcommand)]
enum ModelCmd {
    /// Write a deterministic synthetic model.
    Synth(civetta::synth::SynthArgs),
}

#[derive(clap::Args)]
#[command(allow_negative_numbers = true)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "chat", "prompt_tokens"])))]
struct GenerateArgs {
    #[arg(short, long, default_value = "models/default.gguf")]
    model: PathBuf,
    /// Raw prompt text.
    #[arg(short, long)]
    prompt: Option<String>,
    /// One user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Comma-separated prompt token ids.
    #[arg(long)]
    prompt_tokens: Option<String>,
    #[arg(short = 'n', long, default_value_t = 64)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long)]
    stop: Vec<String>,
    /// Add the BOS token to a raw prompt (default: the model's preference).
    #[arg(long)]
    add_bos: Option<bool>,
    #[arg(long)]
    ignore_eos: bool,
    #[arg(short, long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    backend: civetta::backend::BackendArgs,
    /// Print the final summary (text, token ids, timings) as JSON on stdout instead of the text.
    #[arg(long)]
    json: bool,
    /// Cap on the context length in tokens (0 = the model's own).
    #[arg(long, default_value_t = EngineConfig::default().context_length)]
    context: usize,
}

#[derive(clap::Args)]
struct InfoArgs {
    model: PathBuf,
    #[arg(long)]
    json: bool,
    /// Show long metadata strings and arrays in full.
    #[arg(long)]
    all: bool,
}

#[derive(clap::Args)]
struct LogitsArgs {
    #[arg(short, long)]
    model: PathBuf,
    /// Comma-separated token ids.
    #[arg(long)]
    tokens: String,
    #[arg(short, long, default_value_t = 0)]
    threads: usize,
    #[command(flatten)]
    backend: civetta::backend::BackendArgs,
}

#[derive(clap::Args)]
struct TokenizeArgs {
    #[arg(short, long, default_value = "models/default.gguf")]
    model: PathBuf,
    text: String,
    #[arg(long)]
    add_bos: bool,
    #[arg(long)]
    parse_special: bool,
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            // User errors get one clear line, no backtrace.
            eprintln!("civetta: error: {}", error_line(&e));
            2
        }
    };
    std::process::exit(code);
}

/// The error and its causes on one line, leaving out causes whose text an outer message
/// already repeats (many errors embed their source's text).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line += ": ";
            }
            line += &text;
        }
    }
    line.replace('\n', " ")
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.cmd {
        Cmd::Serve(a) => civetta::server::serve(a).map(|_| 0),
        Cmd::Generate(a) => generate(a).map(|_| 0),
        Cmd::Info(a) => info(a).map(|_| 0),
        Cmd::Model { cmd: ModelCmd::Synth(a) } => civetta::synth::run(&a).map(|_| 0),
        Cmd::Env(a) => civetta::envinfo::cli::run(&a).map(|_| 0),
        Cmd::Kernels(a) => civetta::kernels::cli::run(a),
        Cmd::Bench(a) => civetta::bench::cli::run_bench(&a).map(|_| 0),
        Cmd::Compare(a) => civetta::bench::cli::run_compare(&a),
        Cmd::Repro { cmd } => civetta::repro::cli::run(cmd),
        Cmd::Logits(a) => logits(a).map(|_| 0),
        Cmd::Tokenize(a) => tokenize(a).map(|_| 0),
    }
}

fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',').filter(|x| !x.trim().is_empty()).map(|x| x.trim().parse::<u32>().with_context(|| format!("bad token id {x:?}"))).collect()
}

fn generate(a: GenerateArgs) -> anyhow::Result<()> {
    civetta::server::init_logging("human", "warn");
    let engine = Engine::load(EngineConfig {
        model_path: a.model.clone(),
        threads: a.threads,
        backend: a.backend.backend.clone(),
        gpu: a.backend.gpu_options(),
        max_active_sequences: 1,
        context_length: a.context,
        weights_memory: a.backend.weights_memory.unwrap_or_default(),
        cpu_repack: a.backend.cpu_repack.unwrap_or(true),
        ..EngineConfig::default()
    })?;
    let prompt = match (&a.prompt, &a.chat, &a.prompt_tokens) {
        (Some(p), _, _) => PromptInput::Text { text: p.clone(), add_bos: a.add_bos.unwrap_or(engine.tokenizer().add_bos_default()) },
        (_, Some(c), _) => PromptInput::Chat(vec![ChatMessage { role: "user".into(), content: c.clone() }]),
        (_, _, Some(t)) => PromptInput::Tokens(parse_ids(t)?),
        _ => anyhow::bail!("give --prompt, --chat or --prompt-tokens"),
    };
    let result = stream_generation(&engine, &a, prompt);
    engine.shutdown();
    result
}

/// Runs one generation, printing tokens as they come (or the JSON summary at the end).
fn stream_generation(engine: &Engine, a: &GenerateArgs, prompt: PromptInput) -> anyhow::Result<()> {
    let req = GenerationRequest {
        prompt,
        max_tokens: a.max_tokens,
        sampling: SamplingParams {
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            min_p: a.min_p,
            repetition_penalty: a.repeat_penalty,
            repetition_window: 64,
            seed: a.seed,
        },
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        top_logprobs: 0,
    };
    let mut stream = engine.submit(req)?;
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    while let Some(ev) = stream.blocking_next() {
        match ev {
            GenerationEvent::Token { text: piece, .. } => {
                if a.json {
                    text += &piece;
                } else {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
            }
            GenerationEvent::Done(s) => {
                if a.json {
                    text += &s.text_tail;
                    writeln!(out, "{}", generation_json(&text, &s))?;
                } else {
                    writeln!(out, "{}", s.text_tail)?;
                }
                let t = &s.timings;
                eprintln!(
                    "[{} prompt tokens in {:.3} s ({:.1} t/s), {} generated in {:.3} s ({:.1} t/s), finish {:?}]",
                    s.prompt_tokens,
                    t.prefill.as_secs_f64(),
                    s.prompt_tokens as f64 / t.prefill.as_secs_f64().max(1e-9),
                    s.completion_tokens,
                    t.decode.as_secs_f64(),
                    s.completion_tokens.saturating_sub(1) as f64 / t.decode.as_secs_f64().max(1e-9),
                    s.finish_reason
                );
            }
            GenerationEvent::Error(e) => anyhow::bail!("generation failed: {e}"),
        }
    }
    Ok(())
}

/// The `generate --json` summary; durations in seconds.
fn generation_json(text: &str, s: &civetta::engine::GenerationSummary) -> serde_json::Value {
    let t = &s.timings;
    serde_json::json!({
        "text": text,
        "token_ids": s.token_ids,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "finish_reason": format!("{:?}", s.finish_reason).to_lowercase(),
        "timings": {
            "queue_seconds": t.queue.as_secs_f64(),
            "prefill_seconds": t.prefill.as_secs_f64(),
            "decode_seconds": t.decode.as_secs_f64(),
            "time_to_first_token_seconds": t.time_to_first_token.as_secs_f64(),
            "total_seconds": t.total.as_secs_f64(),
        },
    })
}

fn info(a: InfoArgs) -> anyhow::Result<()> {
    let f = civetta::gguf::GgufFile::open(&a.model)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&civetta::gguf::info::info_json(&f))?);
    } else {
        print!("{}", civetta::gguf::info::render_info(&f, a.all));
    }
    Ok(())
}

fn logits(a: LogitsArgs) -> anyhow::Result<()> {
    let tokens = parse_ids(&a.tokens)?;
    let be = civetta::backend::create_with(&a.backend.backend, a.threads, a.backend.cpu_repack.unwrap_or(true), &a.backend.gpu_options())?;
    let (n_vocab, all) = civetta::with_backend!(be, be => {
        let model = civetta::model::load_file(&a.model, be)?;
        (model.hp.n_vocab, civetta::model::all_logits(&model, &tokens)?)
    });
    let rows: Vec<&[f32]> = all.chunks(n_vocab).collect();
    println!("{}", serde_json::json!({ "n_vocab": n_vocab, "logits": rows }));
    Ok(())
}

fn tokenize(a: TokenizeArgs) -> anyhow::Result<()> {
    let f = civetta::gguf::GgufFile::open(&a.model)?;
    let tk = civetta::tokenizer::Tokenizer::from_gguf(&f)?;
    let ids = tk.encode(&a.text, a.add_bos, a.parse_special);
    let pieces: Vec<&str> = ids.iter().map(|&i| tk.piece(i)).collect();
    println!("{}", serde_json::json!({ "ids": ids, "pieces": pieces }));
    Ok(())
}
