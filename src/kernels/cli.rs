//! `civetta kernels report|gate`: the static resource report of compiled GPU kernels.

use super::gate::{check, Allowlist};
use super::report::{compare, compare_json, render_compare_markdown, render_markdown, scan_build_dir};
use anyhow::{bail, Result};
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct KernelsArgs {
    #[command(subcommand)]
    pub cmd: KernelsCmd,
}

#[derive(Debug, Subcommand)]
pub enum KernelsCmd {
    /// Per-kernel VGPRs, SGPRs, scratch, spills, LDS and waves/SIMD of code objects
    /// built by `make kernels` (DIR is build/kernels/<compiler> or one arch under it).
    Report(ReportArgs),
    /// Exit 1 naming every kernel that spills or uses scratch and is not allow-listed.
    Gate(GateArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Markdown,
    Json,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Build directories, one table each.
    #[arg(required_unless_present = "compare")]
    pub dirs: Vec<PathBuf>,
    /// Compare two builds (e.g. two compilers) side by side.
    #[arg(long, num_args = 2, value_names = ["DIR_A", "DIR_B"], conflicts_with = "dirs")]
    pub compare: Option<Vec<PathBuf>>,
    /// With --compare: list only the kernels that differ.
    #[arg(long, requires = "compare")]
    pub changed_only: bool,
    #[arg(long, value_enum, default_value_t = Format::Markdown)]
    pub format: Format,
}

#[derive(Debug, Args)]
pub struct GateArgs {
    /// Build directory (build/kernels/<compiler>).
    pub dir: PathBuf,
    /// Reviewed exceptions; each entry needs a reason.
    #[arg(long, default_value = "kernels/spill-allowlist.toml")]
    pub allowlist: PathBuf,
}

/// Runs a `civetta kernels` command; returns the process exit code.
pub fn run(args: KernelsArgs) -> Result<i32> {
    match args.cmd {
        KernelsCmd::Report(a) => report(a),
        KernelsCmd::Gate(a) => gate(a),
    }
}

fn report(args: ReportArgs) -> Result<i32> {
    if let Some(pair) = args.compare {
        let [dir_a, dir_b] = pair.as_slice() else { bail!("--compare takes two directories") };
        let (a, b) = (scan_build_dir(dir_a)?, scan_build_dir(dir_b)?);
        let mut rows = compare(&a, &b);
        match args.format {
            // The markdown's closing line counts the differing rows among all of them.
            Format::Markdown => print!("{}", render_compare_markdown(&a, &b, &rows, args.changed_only)),
            Format::Json => {
                if args.changed_only {
                    rows.retain(|r| r.differs());
                }
                println!("{}", serde_json::to_string_pretty(&compare_json(&a, &b, &rows))?)
            }
        }
        return Ok(0);
    }
    let reports = args.dirs.iter().map(|d| scan_build_dir(d)).collect::<Result<Vec<_>>>()?;
    match args.format {
        Format::Markdown => {
            for r in &reports {
                println!("{}", render_markdown(r));
            }
        }
        Format::Json => println!("{}", serde_json::to_string_pretty(&reports)?),
    }
    Ok(0)
}

fn gate(args: GateArgs) -> Result<i32> {
    let allowlist = Allowlist::load(&args.allowlist)?;
    let report = scan_build_dir(&args.dir)?;
    let findings = check(&report, &allowlist);
    let mut failed = 0;
    for f in &findings {
        match f.allowed_because {
            Some(reason) => println!("allowed: {} (reason: {reason})", f.describe(&report.compiler)),
            None => {
                println!("SPILL: {}", f.describe(&report.compiler));
                failed += 1;
            }
        }
    }
    println!(
        "kernels gate ({}): {} kernel instantiations, {} use scratch, {failed} not allow-listed",
        report.compiler,
        report.kernels.len(),
        findings.len()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}
