//! Container layer: none, podman, docker, toolbox, distrobox (or unknown).
//!
//! What each one leaves behind (checked against their sources, 2026):
//! - podman: always creates `/run/.containerenv` (empty, or with `engine="podman-X.Y"`,
//!   `name=`, `id=`, `image=`, `imageid=`, `rootless=` under `--privileged`), sets
//!   `container=podman` in the environment, and `/proc/1/cgroup` names `libpod` (cgroup v1).
//! - docker: creates `/.dockerenv`; `/proc/{1,self}/cgroup` names `docker` with cgroup v1.
//!   `/.dockerenv` alone is no proof: some hosts (these CI VMs) carry a stray one, so it only
//!   counts together with cgroup evidence or a root file system from `/var/lib/docker`.
//! - toolbx (`toolbox create`): a privileged podman container (so `/run/.containerenv`
//!   has fields) with label `com.github.containers.toolbox=true`, env `TOOLBOX_PATH`, the
//!   host's `/` at `/run/host`, `--pid host`; its init writes `/run/.toolboxenv` and (newer)
//!   `/run/.toolbxenv`.
//! - distrobox (`distrobox create`): a privileged podman/docker container with label
//!   `manager=distrobox`, env `container=podman|docker` and `CONTAINER_ID=<name>`, the host's
//!   `/` at `/run/host`, `/usr/bin/distrobox-export` and `/usr/bin/distrobox-host-exec`
//!   bind-mounted; `distrobox-init` writes `/etc/profile.d/distrobox_profile.sh` and ALSO
//!   touches `/run/.toolboxenv` for toolbx compatibility, so distrobox is checked first.
//!
//! Detection order: distrobox markers, toolbox markers, podman, docker, other container
//! evidence (unknown), then none when `/proc/1/cgroup` was readable and showed nothing.
//!
//! The image: `/etc/civetta/image.json` (written by civetta's images: tag, revision,
//! version, created and the OCI labels) wins over `/run/.containerenv`'s `image=`.

use super::{read_trimmed, Field, Probe, UNKNOWN};
use std::collections::BTreeMap;

const DISTROBOX_FILES: &[&str] = &["etc/profile.d/distrobox_profile.sh", "usr/bin/distrobox-export", "usr/bin/distrobox-host-exec"];

/// Parses `/run/.containerenv` (`key="value"` lines).
pub(crate) fn parse_containerenv(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        .collect()
}

/// What the cgroup files say about a runtime.
#[derive(Debug, PartialEq, Eq)]
enum CgroupHint {
    Podman,
    Docker,
    /// containerd, kubepods, lxc: a container, not one we classify.
    Other(String),
    Nothing,
}

fn cgroup_hint(text: &str) -> CgroupHint {
    let t = text.to_ascii_lowercase();
    if t.contains("libpod") {
        CgroupHint::Podman
    } else if t.contains("/docker/") || t.contains("docker-") || t.contains("/docker.") {
        CgroupHint::Docker
    } else if let Some(w) = ["containerd", "kubepods", "lxc"].iter().find(|w| t.contains(*w)) {
        CgroupHint::Other(w.to_string())
    } else {
        CgroupHint::Nothing
    }
}

/// Whether `/` is an overlay whose layers live under /var/lib/docker (Docker's root fs).
fn root_fs_from_docker(mountinfo: &str) -> bool {
    mountinfo.lines().any(|l| {
        let mut parts = l.split_whitespace();
        let mount_point = parts.nth(4);
        mount_point == Some("/") && l.contains("/var/lib/docker/")
    })
}

pub(crate) fn collect(p: &Probe) -> Vec<Field> {
    let mut evidence: Vec<String> = Vec::new();
    let exists = |path: std::path::PathBuf| path.exists();

    let distrobox_files: Vec<&str> = DISTROBOX_FILES.iter().copied().filter(|f| exists(p.root(f))).collect();
    let toolbox_files: Vec<&str> = [".toolboxenv", ".toolbxenv"].into_iter().filter(|f| exists(p.run(f))).collect();
    let containerenv_text = read_trimmed(&p.run(".containerenv"));
    let containerenv = containerenv_text.as_deref().map(parse_containerenv);
    let dockerenv = exists(p.root(".dockerenv"));
    let env_container = p.env("container").map(str::to_string);
    let env_container_id = p.env("CONTAINER_ID").map(str::to_string);
    let env_toolbox_path = p.env("TOOLBOX_PATH").is_some();
    let cgroup1 = read_trimmed(&p.proc("1/cgroup"));
    let cgroup_self = read_trimmed(&p.proc("self/cgroup"));
    let cgroup_readable = cgroup1.is_some() || cgroup_self.is_some();
    let hints: Vec<(&str, CgroupHint)> = [("/proc/1/cgroup", &cgroup1), ("/proc/self/cgroup", &cgroup_self)]
        .into_iter()
        .filter_map(|(name, text)| text.as_deref().map(|t| (name, cgroup_hint(t))))
        .collect();
    let hint_of = |want: &dyn Fn(&CgroupHint) -> bool| hints.iter().find(|(_, h)| want(h)).map(|(n, _)| *n);
    let docker_root = read_trimmed(&p.proc("self/mountinfo")).is_some_and(|m| root_fs_from_docker(&m));

    for f in &distrobox_files {
        evidence.push(format!("/{f} exists"));
    }
    for f in &toolbox_files {
        evidence.push(format!("/run/{f} exists"));
    }
    if let Some(ce) = &containerenv {
        evidence.push(if ce.is_empty() { "/run/.containerenv exists (empty)".into() } else { "/run/.containerenv has fields".into() });
    }
    if let Some(c) = &env_container {
        evidence.push(format!("env container={c}"));
    }
    if let Some(id) = &env_container_id {
        evidence.push(format!("env CONTAINER_ID={id}"));
    }
    if env_toolbox_path {
        evidence.push("env TOOLBOX_PATH set".into());
    }
    for (name, h) in &hints {
        match h {
            CgroupHint::Podman => evidence.push(format!("{name} mentions libpod")),
            CgroupHint::Docker => evidence.push(format!("{name} mentions docker")),
            CgroupHint::Other(w) => evidence.push(format!("{name} mentions {w}")),
            CgroupHint::Nothing => {}
        }
    }
    if docker_root {
        evidence.push("/ is an overlay from /var/lib/docker (/proc/self/mountinfo)".into());
    }

    let podman_cgroup = hint_of(&|h| *h == CgroupHint::Podman);
    let docker_cgroup = hint_of(&|h| *h == CgroupHint::Docker);
    let other_cgroup = hint_of(&|h| matches!(h, CgroupHint::Other(_)));
    let inside_some_container = containerenv.is_some() || env_container.is_some() || podman_cgroup.is_some() || docker_cgroup.is_some();

    let (kind, source): (&str, String) = if !distrobox_files.is_empty() {
        ("distrobox", format!("/{}", distrobox_files[0]))
    } else if env_container_id.is_some() && (inside_some_container || !toolbox_files.is_empty()) {
        ("distrobox", "env CONTAINER_ID".into())
    } else if !toolbox_files.is_empty() {
        ("toolbox", format!("/run/{}", toolbox_files[0]))
    } else if env_toolbox_path && containerenv.is_some() {
        ("toolbox", "env TOOLBOX_PATH + /run/.containerenv".into())
    } else if containerenv.is_some() {
        ("podman", "/run/.containerenv".into())
    } else if let Some(n) = podman_cgroup {
        ("podman", n.to_string())
    } else if env_container.as_deref() == Some("podman") {
        ("podman", "env container".into())
    } else if let Some(n) = docker_cgroup {
        ("docker", if dockerenv { format!("/.dockerenv + {n}") } else { n.to_string() })
    } else if dockerenv && (other_cgroup.is_some() || docker_root) {
        (
            "docker",
            if docker_root { "/.dockerenv + /proc/self/mountinfo".into() } else { format!("/.dockerenv + {}", other_cgroup.unwrap_or("")) },
        )
    } else if env_container.as_deref() == Some("docker") {
        ("docker", "env container".into())
    } else if env_container.is_some() || other_cgroup.is_some() {
        (UNKNOWN, "container evidence of an unclassified runtime".into())
    } else if cgroup_readable {
        if dockerenv {
            evidence.push("/.dockerenv exists but no cgroup or mount evidence of docker: ignored".into());
        }
        ("none", "no container markers; /proc/1/cgroup shows no container runtime".into())
    } else {
        (UNKNOWN, "no container markers, but /proc/*/cgroup not readable".into())
    };

    let mut out = vec![
        Field::new("container.type", kind, source),
        Field::new(
            "container.evidence",
            if evidence.is_empty() { "none".into() } else { evidence.join("; ") },
            "derived (see container.type)",
        ),
    ];
    let in_container = kind != "none";
    out.extend(containerenv_fields(containerenv.as_ref(), in_container));
    out.extend(image_fields(p, containerenv.as_ref(), in_container));
    out
}

fn containerenv_fields(ce: Option<&BTreeMap<String, String>>, in_container: bool) -> Vec<Field> {
    ["engine", "name", "id", "rootless"]
        .into_iter()
        .map(|k| {
            let key = format!("container.{k}");
            match ce {
                Some(m) if m.contains_key(k) => Field::new(key, m[k].clone(), format!("/run/.containerenv {k}=")),
                Some(_) => Field::unknown(key, format!("/run/.containerenv (no {k}=; podman fills it only with --privileged)")),
                None if !in_container => Field::new(key, "none", "not in a container"),
                None => Field::unknown(key, "/run/.containerenv (absent)"),
            }
        })
        .collect()
}

/// The image tag and labels: `/etc/civetta/image.json`, else `/run/.containerenv` image=.
fn image_fields(p: &Probe, ce: Option<&BTreeMap<String, String>>, in_container: bool) -> Vec<Field> {
    const SRC: &str = "/etc/civetta/image.json";
    let mut out = Vec::new();
    let json = match std::fs::read(p.root("etc/civetta/image.json")) {
        Ok(bytes) => match serde_json::from_slice::<serde_json::Value>(&bytes) {
            Ok(v) if v.is_object() => Some(v),
            Ok(_) => {
                out.push(Field::unknown("container.image_json", format!("{SRC} (not a JSON object)")));
                None
            }
            Err(e) => {
                out.push(Field::unknown("container.image_json", format!("{SRC} (invalid JSON: {e})")));
                None
            }
        },
        Err(_) => None,
    };
    let json_str = |k: &str| json.as_ref().and_then(|v| v.get(k)).and_then(|v| v.as_str()).filter(|s| !s.is_empty());
    let ce_image = ce.and_then(|m| m.get("image")).filter(|s| !s.is_empty());
    out.insert(
        0,
        if let Some(tag) = json_str("tag") {
            Field::new("container.image", tag, format!("{SRC} tag"))
        } else if let Some(img) = ce_image {
            Field::new("container.image", img.clone(), "/run/.containerenv image=")
        } else if in_container {
            Field::unknown("container.image", format!("{SRC} (absent) and /run/.containerenv has no image="))
        } else {
            Field::new("container.image", "none", "not in a container")
        },
    );
    if let Some(v) = &json {
        for k in ["revision", "version", "created"] {
            if let Some(s) = json_str(k) {
                out.push(Field::new(format!("container.image_{k}"), s, format!("{SRC} {k}")));
            }
        }
        if let Some(labels) = v.get("labels").and_then(|l| l.as_object()) {
            // serde_json's map is sorted by key, so the label order is stable.
            for (k, val) in labels {
                let val = val.as_str().map(str::to_string).unwrap_or_else(|| val.to_string());
                out.push(Field::new(format!("container.label.{k}"), val, format!("{SRC} labels")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerenv_parsing() {
        let m = parse_containerenv("engine=\"podman-4.3.1\"\nname=\"civ\"\nrootless=1\n\n");
        assert_eq!(m["engine"], "podman-4.3.1");
        assert_eq!(m["name"], "civ");
        assert_eq!(m["rootless"], "1");
        assert!(parse_containerenv("").is_empty());
    }

    #[test]
    fn cgroup_hints() {
        assert_eq!(cgroup_hint("0::/\n"), CgroupHint::Nothing);
        assert_eq!(cgroup_hint("4:memory:/process_api/8724de"), CgroupHint::Nothing);
        assert_eq!(cgroup_hint("0::/machine.slice/libpod-3f2a.scope"), CgroupHint::Podman);
        assert_eq!(cgroup_hint("12:pids:/docker/3f2a9c"), CgroupHint::Docker);
        assert_eq!(cgroup_hint("0::/system.slice/docker-3f2a.scope"), CgroupHint::Docker);
        assert_eq!(cgroup_hint("0::/kubepods/besteffort/pod1"), CgroupHint::Other("kubepods".into()));
    }

    #[test]
    fn docker_root_overlay() {
        let docker = "900 800 0:50 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/docker/overlay2/l/ABC:/var/lib/docker/overlay2/l/DEF,upperdir=/var/lib/docker/overlay2/x/diff";
        let host = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard";
        assert!(root_fs_from_docker(docker));
        assert!(!root_fs_from_docker(host));
    }
}
