//! `civetta repro run|merge|plan|check` command lines.

use super::layer::{BenchInvocation, LayerRunner};
use super::layers::{HostLayer, PodmanLayer, ToolboxLayer, DEFAULT_IMAGE, DEFAULT_TOOLBOX};
use super::report::{CellStatus, ReproReport, KIND};
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Subcommand, Debug)]
pub enum ReproCmd {
    /// Run the same bench in each layer (host, podman, toolbox), interleaved over rounds,
    /// and write one report with every cell and its fingerprint.
    Run(RunArgs),
    /// Join reports (one per boot: IOMMU mode, ...) into one table whose columns are the
    /// factors that differ; warns when columns differ in more than one factor.
    Merge(MergeArgs),
    /// Print the kernel command line and the steps for each IOMMU mode.
    Plan(PlanArgs),
    /// Check a repro report: each named layer ran and has a fingerprint, overhead rows exist.
    Check(CheckArgs),
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Layers to run, comma separated: host, podman, toolbox.
    #[arg(long, value_delimiter = ',', default_value = "host,podman")]
    pub layers: Vec<String>,
    /// The image the podman layer runs.
    #[arg(long, default_value = DEFAULT_IMAGE)]
    pub image: String,
    /// The toolbox container the toolbox layer runs in.
    #[arg(long, default_value = DEFAULT_TOOLBOX)]
    pub toolbox: String,
    /// Rounds: each layer runs the bench once per round, the order rotating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Write the JSON report here.
    #[arg(short = 'o', long)]
    pub output: Option<PathBuf>,
    /// The `civetta bench` arguments (after `--`), e.g. `-m models/default.gguf -p 512 -n 128 -r 3`.
    #[arg(last = true)]
    pub bench: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// Repro reports (`repro run -o`) or bench JSON reports.
    #[arg(required = true, num_args = 1..)]
    pub reports: Vec<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// GiB of memory the GPU may map (GTT/TTM), as in docs/DEPLOY.md.
    #[arg(long, default_value_t = 120)]
    pub gtt_gib: u64,
    /// The layers each boot runs.
    #[arg(long, default_value = "host,podman,toolbox")]
    pub layers: String,
    /// The bench arguments each boot passes.
    #[arg(long, default_value = "-m models/default.gguf --backend hip -p 512 -n 128 -r 3")]
    pub bench: String,
}

#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    pub report: PathBuf,
    /// Layers that must have run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "host,podman")]
    pub layers: Vec<String>,
}

pub fn run(cmd: ReproCmd) -> anyhow::Result<i32> {
    match cmd {
        ReproCmd::Run(a) => run_layers(&a),
        ReproCmd::Merge(a) => merge(&a),
        ReproCmd::Plan(a) => {
            print!("{}", super::plan::render(a.gtt_gib, &a.layers, &a.bench));
            Ok(0)
        }
        ReproCmd::Check(a) => check(&a),
    }
}

/// Exit codes: 0 every layer ran, 4 some were skipped, 1 some failed.
fn run_layers(a: &RunArgs) -> anyhow::Result<i32> {
    if a.rounds == 0 {
        anyhow::bail!("--rounds must be at least 1");
    }
    let bench = BenchInvocation::parse(&a.bench)?;
    let host = HostLayer::current()?;
    let podman = PodmanLayer::new(&a.image);
    let toolbox = ToolboxLayer::new(&a.toolbox);
    let mut layers: Vec<&dyn LayerRunner> = Vec::new();
    for name in &a.layers {
        let layer: &dyn LayerRunner = match name.as_str() {
            "host" => &host,
            "podman" => &podman,
            "toolbox" => &toolbox,
            other => anyhow::bail!("unknown layer {other:?} (host, podman, toolbox)"),
        };
        if layers.iter().any(|l| l.name() == name) {
            anyhow::bail!("layer {name:?} given twice");
        }
        layers.push(layer);
    }
    let report = super::driver::run(&layers, &bench, &a.bench, a.rounds, &mut |line| eprintln!("repro: {line}"));
    if let Some(p) = &a.output {
        std::fs::write(p, serde_json::to_string_pretty(&report)?).with_context(|| format!("writing {}", p.display()))?;
    }
    print!("{}", report.render_md());
    let statuses: Vec<CellStatus> = report.cells.values().map(|c| c.status).collect();
    Ok(if statuses.contains(&CellStatus::Failed) {
        1
    } else if statuses.contains(&CellStatus::Skipped) {
        4
    } else {
        0
    })
}

/// Exit codes: 0, or 3 when the columns are confounded or measured different models.
fn merge(a: &MergeArgs) -> anyhow::Result<i32> {
    let mut columns = Vec::new();
    for p in &a.reports {
        let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        columns.extend(super::merge::columns_of(&p.display().to_string(), &text)?);
    }
    let m = super::merge::merge(&columns);
    print!("{}", m.text);
    Ok(if m.confounded || !m.comparable { 3 } else { 0 })
}

pub fn load(path: &std::path::Path) -> anyhow::Result<ReproReport> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let r: ReproReport = serde_json::from_str(&text).with_context(|| format!("{}: not a civetta repro report", path.display()))?;
    if r.kind != KIND || r.schema_version > super::report::SCHEMA_VERSION {
        anyhow::bail!("{}: kind {:?} schema {} is not a repro report this civetta reads", path.display(), r.kind, r.schema_version);
    }
    Ok(r)
}

/// The problems of a report against the layers that must have run (empty: fine).
pub fn problems(r: &ReproReport, layers: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for l in layers {
        let Some(c) = r.cells.get(l) else {
            out.push(format!("no cell for layer {l}"));
            continue;
        };
        if c.status != CellStatus::Ran {
            out.push(format!("layer {l} did not run: {:?}: {}", c.status, c.reason.as_deref().unwrap_or("")));
            continue;
        }
        // The fingerprint was read inside the layer: a container cell must say so.
        let fp = c.fingerprint();
        let n_fields = fp.and_then(|f| f.get("fields")).and_then(|f| f.as_array()).map_or(0, Vec::len);
        if n_fields == 0 {
            out.push(format!("layer {l}: no fingerprint fields"));
        } else {
            let container = fp.and_then(|f| super::report::field_value(f, "container.type")).unwrap_or("absent");
            let want = if l == "host" { None } else { Some(l.as_str()) };
            if want.is_some_and(|w| w != container) {
                out.push(format!("layer {l}: its fingerprint says container {container:?}, not {l:?}"));
            }
        }
        if c.report.as_ref().is_none_or(|rep| rep.tests.is_empty()) {
            out.push(format!("layer {l}: no test results"));
        }
        if l != super::driver::BASELINE && r.cells.contains_key(super::driver::BASELINE) && !r.overhead.iter().any(|o| &o.layer == l) {
            out.push(format!("layer {l}: no overhead row against {}", super::driver::BASELINE));
        }
    }
    out
}

fn check(a: &CheckArgs) -> anyhow::Result<i32> {
    let r = load(&a.report)?;
    let p = problems(&r, &a.layers);
    if p.is_empty() {
        println!(
            "{}: ok: layers {} ran, each with its fingerprint; {} overhead rows",
            a.report.display(),
            a.layers.join(","),
            r.overhead.len()
        );
        Ok(0)
    } else {
        for x in &p {
            eprintln!("{}: {x}", a.report.display());
        }
        Ok(1)
    }
}
