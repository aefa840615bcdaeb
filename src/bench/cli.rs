//! `civetta bench` and `civetta compare` command lines.

use super::report::{BenchReport, Format};
use anyhow::Context;
use std::io::IsTerminal;
use std::path::PathBuf;

fn parse_list(s: &str) -> Result<Vec<usize>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',').map(|x| x.trim().parse::<usize>().map_err(|e| format!("{x:?}: {e}"))).collect()
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// GGUF model to benchmark (local runs).
    #[arg(short = 'm', long, default_value = "models/default.gguf")]
    pub model: PathBuf,
    /// Prompt-processing sizes (tokens), comma separated; empty or 0 to skip (as llama-bench).
    #[arg(short = 'p', long = "n-prompt", default_value = "512", value_parser = parse_list)]
    pub pp: std::vec::Vec<usize>,
    /// Generation lengths (tokens), comma separated; empty or 0 to skip (as llama-bench).
    #[arg(short = 'n', long = "n-gen", default_value = "128", value_parser = parse_list)]
    pub tg: std::vec::Vec<usize>,
    /// Context depths for generation tests, comma separated.
    #[arg(short = 'd', long = "depth", default_value = "0", value_parser = parse_list)]
    pub depth: std::vec::Vec<usize>,
    /// Measured repetitions per test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: usize,
    /// Unmeasured warm-up runs per test.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// CPU threads (0 = one per physical core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    #[command(flatten)]
    pub backend: crate::backend::BackendArgs,
    #[arg(short = 'o', long, value_enum, default_value = "md")]
    pub output: Format,
    /// Also write the JSON report here.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Greedy tokens per hashed completion (0 disables the bit-exactness hashes).
    #[arg(long, default_value_t = 32)]
    pub hash_tokens: usize,
    /// Per-kernel timing during the run.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub kernel_timing: String,
    /// Fraction of kernel calls timed.
    #[arg(long, default_value_t = 1.0)]
    pub sample_rate: f64,
    #[arg(long, default_value_t = 64)]
    pub prefill_batch: usize,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
    /// Benchmark a running daemon through gRPC instead (e.g. http://127.0.0.1:50051).
    #[arg(long)]
    pub remote: Option<String>,
    /// Benchmark a running daemon through its OpenAI-compatible HTTP API (e.g.
    /// http://127.0.0.1:8080): streamed /v1/completions. With --remote too, both protocols run
    /// in one report, each concurrency level over gRPC then over HTTP.
    #[arg(long)]
    pub remote_http: Option<String>,
    /// A file holding the bearer token of a daemon with server.auth_token_* (both protocols).
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Concurrency levels for --remote / --remote-http (empty to run only --mixed).
    #[arg(long, default_value = "1,2,4", value_parser = parse_list)]
    pub concurrency: std::vec::Vec<usize>,
    /// Requests per concurrency level for --remote / --remote-http.
    #[arg(long, default_value_t = 8)]
    pub requests: usize,
    /// Also run the mixed scenario: a prompt of this many tokens (3000 when no value is given)
    /// arrives while --mixed-streams streams decode; reports their inter-token latency idle vs
    /// during its prefill.
    #[arg(long, num_args = 0..=1, default_missing_value = "3000", value_name = "PROMPT_TOKENS")]
    pub mixed: Option<usize>,
    /// Decoding streams of the mixed scenario.
    #[arg(long, default_value_t = 4)]
    pub mixed_streams: usize,
    /// max_tokens of each decoding stream of the mixed scenario: must outlast the long
    /// prompt's prefill (the report warns when a stream ended first).
    #[arg(long, default_value_t = 1024)]
    pub mixed_stream_tokens: usize,
    /// Tokens each stream decodes (all together) before the long prompt is sent.
    #[arg(long, default_value_t = 32)]
    pub mixed_idle_tokens: usize,
    /// Then run the mixed scenario's streams once more without the long prompt, to as many
    /// tokens, and report their gaps at the positions that fell inside its prefill (`control`):
    /// the streams' own gaps grow with their KV while it prefills.
    #[arg(long)]
    pub mixed_control: bool,
}

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// Baseline report (JSON from `civetta bench -o json`).
    pub base: PathBuf,
    /// Changed report.
    pub new: PathBuf,
    /// Write per-kernel time bars side by side as SVG.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// The fingerprint of this process's environment as JSON.
pub fn local_fingerprint(backend: &str) -> serde_json::Value {
    crate::envinfo::collect(&crate::envinfo::CollectOptions::system(backend)).to_json()
}

fn progress_bar(quiet: bool) -> indicatif::ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(0);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}").expect("static template"),
    );
    pb
}

pub fn run_bench(args: &BenchArgs) -> anyhow::Result<()> {
    // Warnings of the engine and backends (a GPU graph capture that failed, ...) reach stderr,
    // as in `generate`; CIVETTA_LOG sets another filter.
    crate::server::init_logging("human", "warn");
    let pb = progress_bar(args.quiet);
    let report = if args.remote.is_some() || args.remote_http.is_some() {
        let token = match &args.auth_token_file {
            Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?.trim().to_string()),
            None => None,
        };
        let plan = super::remote::RemotePlan {
            grpc: args.remote.clone(),
            http: args.remote_http.clone(),
            token,
            concurrency: args.concurrency.iter().copied().filter(|&c| c > 0).collect(),
            requests_per_level: args.requests.max(1),
            max_tokens: args.tg.first().copied().unwrap_or(32).max(1),
            prompt: "Write a short story about a lighthouse keeper.".into(),
            mixed: args.mixed.map(|prompt_tokens| super::remote::MixedPlan {
                prompt_tokens: prompt_tokens.max(1),
                streams: args.mixed_streams.max(1),
                stream_tokens: args.mixed_stream_tokens.max(1),
                idle_tokens: args.mixed_idle_tokens,
                control: args.mixed_control,
            }),
        };
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
        rt.block_on(super::remote::run(&plan, &pb))?
    } else {
        if args.repetitions == 0 {
            anyhow::bail!("--repetitions must be at least 1");
        }
        let plan = super::local::LocalPlan {
            model: args.model.clone(),
            threads: args.threads,
            backend: args.backend.backend.clone(),
            gpu: args.backend.gpu_options(),
            pp: args.pp.iter().copied().filter(|&n| n > 0).collect(),
            tg: args.tg.iter().copied().filter(|&n| n > 0).collect(),
            depths: args.depth.clone(),
            repetitions: args.repetitions,
            warmup: args.warmup,
            hash_tokens: args.hash_tokens,
            kernel_timing: args.kernel_timing == "on",
            sample_rate: args.sample_rate,
            prefill_batch: args.prefill_batch,
            weights_memory: args.backend.weights_memory,
            cpu_repack: args.backend.cpu_repack,
        };
        super::local::run(&plan, &pb)?
    };
    pb.finish_and_clear();
    if let Some(p) = &args.json_out {
        std::fs::write(p, report.render(Format::Json)).with_context(|| format!("writing {}", p.display()))?;
    }
    print!("{}", report.render(args.output));
    Ok(())
}

pub fn load_report(path: &std::path::Path) -> anyhow::Result<BenchReport> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let r: BenchReport = serde_json::from_str(&text).with_context(|| format!("{}: not a civetta bench JSON report", path.display()))?;
    if r.schema_version > super::report::SCHEMA_VERSION {
        anyhow::bail!(
            "{}: schema version {} is newer than this civetta understands ({})",
            path.display(),
            r.schema_version,
            super::report::SCHEMA_VERSION
        );
    }
    Ok(r)
}

/// Prints the comparison; returns exit code 0 when comparable, 3 when the runs measured different things.
pub fn run_compare(args: &CompareArgs) -> anyhow::Result<i32> {
    let base = load_report(&args.base)?;
    let new = load_report(&args.new)?;
    let c = super::compare::compare(&base, &new);
    print!("{}", c.text);
    if let Some(p) = &args.plot {
        std::fs::write(p, plot_svg(&base, &new)).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(if c.comparable { 0 } else { 3 })
}

/// Per-kernel time per call, baseline and change side by side, as a plain SVG bar chart.
pub fn plot_svg(base: &BenchReport, new: &BenchReport) -> String {
    let rows: Vec<(String, f64, f64)> = base
        .profile
        .kernels
        .iter()
        .map(|k| {
            let n = new
                .profile
                .kernels
                .iter()
                .find(|x| x.kernel == k.kernel && x.shape_class == k.shape_class)
                .map(|x| x.total_seconds)
                .unwrap_or(0.0);
            (format!("{} [{}]", k.kernel, k.shape_class), k.total_seconds, n)
        })
        .collect();
    let max = rows.iter().map(|r| r.1.max(r.2)).fold(0.0, f64::max).max(1e-12);
    let (label_w, bar_w, row_h) = (260.0, 420.0, 26.0);
    let h = 50.0 + rows.len() as f64 * row_h;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<text x=\"10\" y=\"20\">kernel time (s): baseline (grey) vs change (blue)</text>\n",
        label_w + bar_w + 120.0
    );
    for (i, (name, a, b)) in rows.iter().enumerate() {
        let y = 36.0 + i as f64 * row_h;
        let esc = name.replace('&', "&amp;").replace('<', "&lt;");
        s += &format!("<text x=\"10\" y=\"{}\">{esc}</text>\n", y + 14.0);
        s += &format!("<rect x=\"{label_w}\" y=\"{y}\" width=\"{:.1}\" height=\"10\" fill=\"#999\"/>\n", a / max * bar_w);
        s += &format!("<rect x=\"{label_w}\" y=\"{}\" width=\"{:.1}\" height=\"10\" fill=\"#36c\"/>\n", y + 11.0, b / max * bar_w);
        s += &format!("<text x=\"{}\" y=\"{}\">{a:.4} / {b:.4}</text>\n", label_w + bar_w + 8.0, y + 14.0);
    }
    s + "</svg>\n"
}
