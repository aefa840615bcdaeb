//! `civetta env`: print the environment fingerprint.

use super::{collect, CollectOptions, EnvRoots};
use std::path::PathBuf;

/// Print the environment fingerprint (each field with its source).
#[derive(clap::Args, Debug, Clone)]
pub struct EnvArgs {
    /// Print JSON (the schema `civetta bench` embeds) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where /sys is (for tests and inspecting another root).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sys_root: PathBuf,
    /// Where /proc is.
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where /run is.
    #[arg(long, value_name = "DIR", default_value = "/run")]
    pub run_root: PathBuf,
    /// The root for /.dockerenv, /etc/os-release, /etc/civetta/image.json, /dev/kfd.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// The backend to report as in use.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// The built GPU kernels (with compiler.txt files); default $CIVETTA_KERNEL_DIR, then ./build/kernels.
    #[arg(long, value_name = "DIR")]
    pub kernel_dir: Option<PathBuf>,
}

pub fn run(args: &EnvArgs) -> anyhow::Result<()> {
    let mut opts = CollectOptions::system(args.backend.clone());
    opts.roots = EnvRoots { sys: args.sys_root.clone(), proc: args.proc_root.clone(), run: args.run_root.clone(), root: args.root.clone() };
    opts.kernel_build_dir = args.kernel_dir.clone();
    let fp = collect(&opts);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&fp.to_json())?);
    } else {
        print!("{}", fp.render_text());
    }
    Ok(())
}
