//! The real layers: the host binary, a podman container of an image, a toolbox container.
//!
//! Each builds the command line of one bench run ([`LayerRunner::command`], pure, so its
//! construction is tested without podman) and executes it with [`run_bench_command`].

use super::layer::{on_path, run_bench_command, BenchInvocation, LayerRunner};
use crate::bench::BenchReport;
use std::path::{Path, PathBuf};

/// The image `--image` defaults to: `make image-cpu` (scripts/containers-build-cpu.sh).
pub const DEFAULT_IMAGE: &str = "localhost/civetta:cpu";
/// The toolbox container `--toolbox` defaults to.
pub const DEFAULT_TOOLBOX: &str = "civetta-toolbox";
/// Where the podman layer mounts the model's directory entry (read-only).
const CONTAINER_MODEL_DIR: &str = "/models/repro";

/// Why a GPU backend cannot run here, if it cannot: its device node is missing.
fn gpu_missing(bench: &BenchInvocation, dev_root: &Path) -> Option<String> {
    if !bench.needs_gpu() {
        return None;
    }
    let node = if bench.backend == "cuda" { "dev/nvidiactl" } else { "dev/kfd" };
    (!dev_root.join(node).exists()).then(|| format!("no GPU: backend {} needs /{node}, which is absent", bench.backend))
}

/// The civetta binary on the host.
pub struct HostLayer {
    pub binary: PathBuf,
    /// `/` normally; tests point it at a fixture root to check the GPU device test.
    pub dev_root: PathBuf,
}

impl HostLayer {
    /// The running civetta executable.
    pub fn current() -> anyhow::Result<Self> {
        Ok(HostLayer { binary: std::env::current_exe()?, dev_root: "/".into() })
    }
}

impl LayerRunner for HostLayer {
    fn name(&self) -> &str {
        "host"
    }

    fn check(&self, bench: &BenchInvocation) -> Result<(), String> {
        gpu_missing(bench, &self.dev_root).map_or(Ok(()), Err)
    }

    fn command(&self, bench: &BenchInvocation) -> Vec<String> {
        let mut cmd = vec![self.binary.display().to_string()];
        cmd.extend(bench.bench_args(&bench.model.display().to_string()));
        cmd
    }

    fn run(&self, bench: &BenchInvocation) -> anyhow::Result<BenchReport> {
        run_bench_command(&self.command(bench))
    }
}

/// `podman run` of an image whose entrypoint is civetta (every image in containers/).
pub struct PodmanLayer {
    pub podman: String,
    pub image: String,
    pub dev_root: PathBuf,
}

impl PodmanLayer {
    pub fn new(image: &str) -> Self {
        PodmanLayer { podman: "podman".into(), image: image.into(), dev_root: "/".into() }
    }
}

impl LayerRunner for PodmanLayer {
    fn name(&self) -> &str {
        "podman"
    }

    fn check(&self, bench: &BenchInvocation) -> Result<(), String> {
        if !self.podman.contains('/') && !on_path(&self.podman, std::env::var_os("PATH").as_deref()) {
            return Err(format!("{} is not installed (not on PATH)", self.podman));
        }
        let exists = std::process::Command::new(&self.podman).args(["image", "exists", &self.image]).status();
        match exists {
            Ok(s) if s.success() => {}
            Ok(_) => return Err(format!("image {} not found (build it: make image-cpu, or make image IMAGE=<tag>)", self.image)),
            Err(e) => return Err(format!("{} image exists failed: {e}", self.podman)),
        }
        if let Err(e) = bench.model_on_host() {
            return Err(format!("{e:#}"));
        }
        gpu_missing(bench, &self.dev_root).map_or(Ok(()), Err)
    }

    fn command(&self, bench: &BenchInvocation) -> Vec<String> {
        // The model is mounted under its own file name, read-only; a symlink is resolved
        // first (podman would mount the link's target anyway, but the name must be a file).
        let host_model = bench.model_on_host().unwrap_or_else(|_| bench.model.clone());
        let file = host_model.file_name().map_or("model.gguf".into(), |n| n.to_string_lossy().into_owned());
        let inside = format!("{CONTAINER_MODEL_DIR}/{file}");
        let mut cmd: Vec<String> = [&self.podman, "run", "--rm", "--pull=never", "--init", "--network=none"].map(String::from).to_vec();
        // SELinux hosts (Fedora) would deny the container the host's model file and devices.
        cmd.extend(["--security-opt", "label=disable"].map(String::from));
        cmd.extend(["-v".into(), format!("{}:{inside}:ro", host_model.display())]);
        if bench.needs_gpu() {
            if bench.backend == "cuda" {
                cmd.extend(["--device", "nvidia.com/gpu=all"].map(String::from));
            } else {
                // As docs/DEPLOY.md runs the ROCm images.
                cmd.extend(["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "keep-groups"].map(String::from));
            }
        }
        cmd.push(self.image.clone());
        cmd.extend(bench.bench_args(&inside));
        cmd
    }

    fn run(&self, bench: &BenchInvocation) -> anyhow::Result<BenchReport> {
        run_bench_command(&self.command(bench))
    }
}

/// `toolbox run` in an existing toolbox container (of a `-toolbox` image, which installs
/// civetta at /usr/bin/civetta). Toolbox mounts the host's root at /run/host, so the model
/// is reached there whatever its path.
pub struct ToolboxLayer {
    pub toolbox: String,
    pub container: String,
    pub dev_root: PathBuf,
}

impl ToolboxLayer {
    pub fn new(container: &str) -> Self {
        ToolboxLayer { toolbox: "toolbox".into(), container: container.into(), dev_root: "/".into() }
    }
}

impl LayerRunner for ToolboxLayer {
    fn name(&self) -> &str {
        "toolbox"
    }

    fn check(&self, bench: &BenchInvocation) -> Result<(), String> {
        let path = std::env::var_os("PATH");
        if !on_path(&self.toolbox, path.as_deref()) {
            return Err(format!("{} is not installed (not on PATH)", self.toolbox));
        }
        // Toolbox containers are podman containers of the same name.
        match std::process::Command::new("podman").args(["container", "exists", &self.container]).status() {
            Ok(s) if s.success() => {}
            _ => {
                return Err(format!(
                    "no toolbox container {:?} (create it: toolbox create --image localhost/civetta:<tag>-toolbox {})",
                    self.container, self.container
                ))
            }
        }
        if let Err(e) = bench.model_on_host() {
            return Err(format!("{e:#}"));
        }
        gpu_missing(bench, &self.dev_root).map_or(Ok(()), Err)
    }

    fn command(&self, bench: &BenchInvocation) -> Vec<String> {
        let host_model = bench.model_on_host().unwrap_or_else(|_| bench.model.clone());
        let inside = format!("/run/host{}", host_model.display());
        let mut cmd: Vec<String> = [&self.toolbox, "run", "--container", &self.container, "/usr/bin/civetta"].map(String::from).to_vec();
        cmd.extend(bench.bench_args(&inside));
        cmd
    }

    fn run(&self, bench: &BenchInvocation) -> anyhow::Result<BenchReport> {
        run_bench_command(&self.command(bench))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inv(model: &Path, backend: &str) -> BenchInvocation {
        BenchInvocation { model: model.to_path_buf(), backend: backend.into(), args: vec!["-p".into(), "32".into()] }
    }

    fn tmp_model() -> (PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("civetta-layers-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("smol.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        let link = dir.join("default.gguf");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        (dir, link)
    }

    #[test]
    fn podman_mounts_the_resolved_model_read_only() {
        let (dir, link) = tmp_model();
        let real = std::fs::canonicalize(dir.join("smol.gguf")).unwrap();
        let cmd = PodmanLayer::new("localhost/civetta:cpu").command(&inv(&link, "cpu"));
        let joined = cmd.join(" ");
        assert!(joined.starts_with("podman run --rm --pull=never --init --network=none"), "{joined}");
        assert!(joined.contains(&format!("-v {}:/models/repro/smol.gguf:ro", real.display())), "{joined}");
        assert!(!joined.contains("/dev/kfd"), "the CPU backend needs no device: {joined}");
        let image_at = cmd.iter().position(|a| a == "localhost/civetta:cpu").unwrap();
        assert_eq!(cmd[image_at + 1..], ["bench", "-m", "/models/repro/smol.gguf", "-p", "32", "-o", "json", "-q"]);
        let gpu = PodmanLayer::new("localhost/civetta:rocm-7.1.1-clang20").command(&inv(&link, "hip")).join(" ");
        assert!(gpu.contains("--device /dev/kfd --device /dev/dri --group-add keep-groups"), "{gpu}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn toolbox_reaches_the_model_through_run_host() {
        let (dir, link) = tmp_model();
        let real = std::fs::canonicalize(dir.join("smol.gguf")).unwrap();
        let cmd = ToolboxLayer::new("civetta-7.1.1").command(&inv(&link, "hip")).join(" ");
        assert_eq!(
            cmd,
            format!("toolbox run --container civetta-7.1.1 /usr/bin/civetta bench -m /run/host{} -p 32 -o json -q", real.display())
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_gpu_backend_without_its_device_is_skipped_with_the_reason() {
        let no_dev = std::env::temp_dir().join(format!("civetta-nodev-{}", std::process::id()));
        std::fs::create_dir_all(&no_dev).unwrap();
        let host = HostLayer { binary: "/bin/civetta".into(), dev_root: no_dev.clone() };
        let model = Path::new("m.gguf");
        assert_eq!(host.check(&inv(model, "cpu")), Ok(()));
        let why = host.check(&inv(model, "hip")).unwrap_err();
        assert_eq!(why, "no GPU: backend hip needs /dev/kfd, which is absent");
        std::fs::create_dir_all(no_dev.join("dev")).unwrap();
        std::fs::write(no_dev.join("dev/kfd"), b"").unwrap();
        assert_eq!(host.check(&inv(model, "hip")), Ok(()));
        std::fs::remove_dir_all(&no_dev).unwrap();
    }

    #[test]
    fn missing_podman_or_toolbox_is_a_reason_not_an_error() {
        let p = PodmanLayer { podman: "civetta-no-such-podman".into(), image: DEFAULT_IMAGE.into(), dev_root: "/".into() };
        let why = p.check(&inv(Path::new("m.gguf"), "cpu")).unwrap_err();
        assert!(why.contains("not installed"), "{why}");
        let t = ToolboxLayer { toolbox: "civetta-no-such-toolbox".into(), container: DEFAULT_TOOLBOX.into(), dev_root: "/".into() };
        assert!(t.check(&inv(Path::new("m.gguf"), "cpu")).unwrap_err().contains("not installed"));
    }
}
