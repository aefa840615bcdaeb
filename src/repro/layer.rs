//! The layer contract: something that runs one `civetta bench` and hands back its report.
//!
//! A layer is where the bench runs: on the host, in a podman container of an image, in a
//! toolbox container. The driver only sees [`LayerRunner`], so tests use a fake one and the
//! real ones ([`super::layers`]) only build and execute commands.

use crate::bench::BenchReport;
use anyhow::Context;
use std::path::PathBuf;

/// One layer the driver can run the bench in.
pub trait LayerRunner {
    /// The layer's name (`host`, `podman`, `toolbox`): the key of its cell in the report.
    fn name(&self) -> &str;
    /// `Err(reason)` when the layer cannot run on this machine (no podman, no toolbox
    /// container, no GPU device): the cell is reported as skipped with that reason.
    fn check(&self, bench: &BenchInvocation) -> Result<(), String>;
    /// The command line of one run, as it is executed (recorded in the report so a reader
    /// can repeat a cell by hand).
    fn command(&self, bench: &BenchInvocation) -> Vec<String>;
    /// Runs the bench once and returns its report.
    fn run(&self, bench: &BenchInvocation) -> anyhow::Result<BenchReport>;
}

/// The `civetta bench` arguments shared by every layer, split into the model (each layer
/// names it by its own path: a container sees it at its mount point) and the rest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BenchInvocation {
    /// The model file on the host.
    pub model: PathBuf,
    /// The compute backend (`--backend`), to know which devices a layer needs.
    pub backend: String,
    /// Every other bench argument, in the order given.
    pub args: Vec<String>,
}

/// Options `repro` sets itself: the report must come back as JSON on stdout.
const RESERVED: &[&str] = &["-o", "--output", "--json-out", "--remote", "-h", "--help"];

impl BenchInvocation {
    /// Parses the arguments after `--` exactly as `civetta bench` would (so a typo fails
    /// here, before any layer runs) and takes the model out.
    pub fn parse(args: &[String]) -> anyhow::Result<Self> {
        for a in args {
            let name = a.split('=').next().unwrap_or(a);
            if RESERVED.contains(&name) {
                anyhow::bail!("bench argument {a:?} is set by `civetta repro` (the report comes back as JSON); leave it out");
            }
        }
        #[derive(clap::Parser)]
        #[command(name = "civetta bench")]
        struct Bench {
            #[command(flatten)]
            args: crate::bench::cli::BenchArgs,
        }
        let parsed = <Bench as clap::Parser>::try_parse_from(std::iter::once("bench".to_string()).chain(args.iter().cloned()))
            .map_err(|e| anyhow::anyhow!("bad bench arguments after `--`: {}", e.to_string().trim()))?;
        let mut rest = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if a == "-m" || a == "--model" {
                it.next();
            } else if !(a.starts_with("--model=") || (a.starts_with("-m") && a.len() > 2 && !a.starts_with("--"))) {
                rest.push(a.clone());
            }
        }
        Ok(BenchInvocation { model: parsed.args.model, backend: parsed.args.backend.backend, args: rest })
    }

    /// The bench arguments for a layer that sees the model at `model`.
    pub fn bench_args(&self, model: &str) -> Vec<String> {
        let mut v: Vec<String> = vec!["bench".into(), "-m".into(), model.into()];
        v.extend(self.args.iter().cloned());
        v.extend(["-o", "json", "-q"].map(String::from));
        v
    }

    /// The model's absolute path with symlinks resolved (what a container mounts).
    pub fn model_on_host(&self) -> anyhow::Result<PathBuf> {
        std::fs::canonicalize(&self.model).with_context(|| format!("model {}", self.model.display()))
    }

    /// True for a GPU backend, whose device nodes a layer must have.
    pub fn needs_gpu(&self) -> bool {
        !matches!(self.backend.as_str(), "cpu")
    }
}

/// Runs a command line and parses the bench report it prints on stdout.
pub fn run_bench_command(cmd: &[String]) -> anyhow::Result<BenchReport> {
    let (program, args) = cmd.split_first().context("empty command")?;
    let out = std::process::Command::new(program).args(args).output().with_context(|| format!("starting {program}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(8).collect::<Vec<_>>().into_iter().rev().collect();
        anyhow::bail!("`{}` failed ({}): {}", cmd.join(" "), out.status, tail.join(" | "));
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("`{}` did not print a bench JSON report (first bytes: {:?})", cmd.join(" "), head(&out.stdout)))
}

fn head(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

/// True when `program` is an executable file in one of the `PATH` directories.
pub fn on_path(program: &str, path_var: Option<&std::ffi::OsStr>) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Some(path) = path_var else {
        return false;
    };
    std::env::split_paths(path)
        .map(|d| d.join(program))
        .any(|p| std::fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_model_is_taken_out_in_every_spelling() {
        for args in [
            s(&["-m", "m.gguf", "-p", "32"]),
            s(&["--model", "m.gguf", "-p", "32"]),
            s(&["--model=m.gguf", "-p", "32"]),
            s(&["-mm.gguf", "-p", "32"]),
        ] {
            let inv = BenchInvocation::parse(&args).unwrap();
            assert_eq!(inv.model, PathBuf::from("m.gguf"), "{args:?}");
            assert_eq!(inv.args, s(&["-p", "32"]), "{args:?}");
        }
        let inv = BenchInvocation::parse(&s(&["-p", "32", "--backend", "hip"])).unwrap();
        assert_eq!(inv.model, PathBuf::from("models/default.gguf"));
        assert!(inv.needs_gpu());
        assert_eq!(
            inv.bench_args("/models/x.gguf"),
            s(&["bench", "-m", "/models/x.gguf", "-p", "32", "--backend", "hip", "-o", "json", "-q"])
        );
    }

    #[test]
    fn reserved_and_unknown_arguments_are_refused() {
        let e = BenchInvocation::parse(&s(&["--json-out", "x.json"])).unwrap_err().to_string();
        assert!(e.contains("set by `civetta repro`"), "{e}");
        assert!(BenchInvocation::parse(&s(&["-o=md"])).is_err());
        let e = BenchInvocation::parse(&s(&["--no-such-flag"])).unwrap_err().to_string();
        assert!(e.contains("bad bench arguments"), "{e}");
    }

    #[test]
    fn path_lookup() {
        let dir = std::env::temp_dir().join(format!("civetta-onpath-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("fakeprog");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(on_path("fakeprog", Some(dir.as_os_str())));
        assert!(!on_path("nope", Some(dir.as_os_str())));
        assert!(!on_path("fakeprog", None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
