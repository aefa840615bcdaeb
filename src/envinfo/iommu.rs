//! IOMMU mode: off, passthrough (identity domains), translated (DMA domains) or unknown.
//!
//! Precedence, most authoritative first:
//! 1. the domain types under `/sys/kernel/iommu_groups/*/type`: what the kernel actually
//!    does. The GPU's own group (`/sys/class/drm/cardN/device/iommu_group`) decides when it
//!    can be found; otherwise all groups must agree (`identity` -> passthrough,
//!    `DMA`/`DMA-FQ` -> translated; `blocked`/`unmanaged`, e.g. VFIO, are not counted);
//! 2. no IOMMU registered with the kernel at all (`/sys/class/iommu` and
//!    `/sys/kernel/iommu_groups` both exist and are empty) -> off: no device is translated,
//!    whatever the command line asked for;
//! 3. the kernel command line: `amd_iommu=off`, `intel_iommu=off`, `iommu=off` -> off (this
//!    wins over the rest of the line: a disabled IOMMU has no domains); otherwise the last
//!    of `iommu=pt` / `iommu.passthrough=1` (passthrough) and `iommu=nopt` /
//!    `iommu.passthrough=0` (translated), as the kernel applies them in order;
//! 4. unknown (the default domain type is a kernel build option we cannot see).

use super::{cmdline_params, list_dir, read_trimmed, Field, Probe};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Off,
    Passthrough,
    Translated,
    Unknown,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Passthrough => "passthrough",
            Mode::Translated => "translated",
            Mode::Unknown => "unknown",
        }
    }

    fn from_domain_type(t: &str) -> Option<Mode> {
        match t {
            "identity" => Some(Mode::Passthrough),
            "DMA" | "DMA-FQ" => Some(Mode::Translated),
            _ => None,
        }
    }
}

/// The mode the command line asks for, with the deciding parameters.
pub(crate) fn mode_from_cmdline(cmdline: &str) -> Option<(Mode, String)> {
    let mut off = Vec::new();
    let mut last: Option<(Mode, String)> = None;
    for (key, value) in cmdline_params(cmdline) {
        let token = format!("{key}={value}");
        let options: Vec<&str> = value.split(',').map(str::trim).collect();
        match key {
            "amd_iommu" | "intel_iommu" if options.contains(&"off") => off.push(token),
            "iommu" => match value {
                "off" => off.push(token),
                "pt" => last = Some((Mode::Passthrough, token)),
                "nopt" => last = Some((Mode::Translated, token)),
                _ => {}
            },
            "iommu.passthrough" => match value.to_ascii_lowercase().as_str() {
                "1" | "y" | "yes" | "on" | "true" => last = Some((Mode::Passthrough, token)),
                "0" | "n" | "no" | "off" | "false" => last = Some((Mode::Translated, token)),
                _ => {}
            },
            _ => {}
        }
    }
    if !off.is_empty() {
        return Some((Mode::Off, off.join(" ")));
    }
    last
}

/// Domain types of the IOMMU groups: (group number, type) for each group with a readable type.
fn group_types(p: &Probe) -> Option<Vec<(String, String)>> {
    let groups = list_dir(&p.sys("kernel/iommu_groups"))?;
    Some(groups.into_iter().filter_map(|g| read_trimmed(&p.sys(&format!("kernel/iommu_groups/{g}/type"))).map(|t| (g, t))).collect())
}

/// The IOMMU group of each DRM card, e.g. ("card1", "12").
fn gpu_groups(p: &Probe) -> Vec<(String, String)> {
    let cards = list_dir(&p.sys("class/drm")).unwrap_or_default();
    cards
        .into_iter()
        .filter(|c| super::gpu::is_card_name(c))
        .filter_map(|c| {
            let link = std::fs::read_link(p.sys(&format!("class/drm/{c}/device/iommu_group"))).ok()?;
            let group = link.file_name()?.to_string_lossy().into_owned();
            Some((c, group))
        })
        .collect()
}

pub(crate) fn collect(p: &Probe) -> Vec<Field> {
    let mut out = Vec::new();
    let hardware = list_dir(&p.sys("class/iommu"));
    out.push(match &hardware {
        Some(h) if h.is_empty() => Field::new("iommu.hardware", "none", "/sys/class/iommu (empty)"),
        Some(h) => Field::new("iommu.hardware", h.join(","), "/sys/class/iommu"),
        None => Field::unknown("iommu.hardware", "/sys/class/iommu (not readable)"),
    });

    let groups_listing = list_dir(&p.sys("kernel/iommu_groups"));
    let types = group_types(p);
    out.push(match &groups_listing {
        Some(g) => Field::new("iommu.group_count", g.len().to_string(), "/sys/kernel/iommu_groups"),
        None => Field::unknown("iommu.group_count", "/sys/kernel/iommu_groups (not readable)"),
    });
    let mut type_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, t) in types.iter().flatten() {
        *type_counts.entry(t.as_str()).or_default() += 1;
    }
    out.push(match (&types, type_counts.is_empty()) {
        (None, _) => Field::unknown("iommu.domain_types", "/sys/kernel/iommu_groups/*/type (not readable)"),
        (Some(_), true) => Field::new("iommu.domain_types", "none", "/sys/kernel/iommu_groups/*/type (no groups)"),
        (Some(_), false) => Field::new(
            "iommu.domain_types",
            type_counts.iter().map(|(t, n)| format!("{t}:{n}")).collect::<Vec<_>>().join(","),
            "/sys/kernel/iommu_groups/*/type",
        ),
    });

    let cmdline_mode = p.cmdline.as_deref().and_then(mode_from_cmdline);
    out.push(match (&p.cmdline, &cmdline_mode) {
        (None, _) => Field::unknown("iommu.cmdline", "/proc/cmdline (not readable)"),
        (Some(_), None) => Field::new("iommu.cmdline", "none", "/proc/cmdline (no IOMMU parameters)"),
        (Some(_), Some((_, tokens))) => Field::new("iommu.cmdline", tokens.clone(), "/proc/cmdline"),
    });

    let (mode, source, evidence) = decide(p, &hardware, &groups_listing, types.as_deref().unwrap_or(&[]), &cmdline_mode);
    out.push(Field::new("iommu.mode", mode.as_str(), source));
    out.push(Field::new("iommu.evidence", evidence, "derived (see iommu.mode)"));
    out
}

/// Applies the precedence documented at the top of this file: (mode, source, evidence).
fn decide(
    p: &Probe,
    hardware: &Option<Vec<String>>,
    groups: &Option<Vec<String>>,
    types: &[(String, String)],
    cmdline_mode: &Option<(Mode, String)>,
) -> (Mode, String, String) {
    // 1a. The GPU's own group.
    for (card, group) in gpu_groups(p) {
        if let Some((_, t)) = types.iter().find(|(g, _)| *g == group) {
            if let Some(mode) = Mode::from_domain_type(t) {
                return (
                    mode,
                    format!("/sys/class/drm/{card}/device/iommu_group/type"),
                    format!("{card} is in IOMMU group {group} with domain type {t}"),
                );
            }
        }
    }
    // 1b. All counted groups agree.
    let modes: Vec<(Mode, &str)> = types.iter().filter_map(|(_, t)| Mode::from_domain_type(t).map(|m| (m, t.as_str()))).collect();
    let mixed = modes.iter().any(|(m, _)| *m != modes[0].0);
    if !modes.is_empty() && !mixed {
        return (
            modes[0].0,
            "/sys/kernel/iommu_groups/*/type".to_string(),
            format!("all {} IOMMU groups with a DMA domain have type {}", modes.len(), modes[0].1),
        );
    }
    let mixed_note = if mixed { "IOMMU groups mix identity and DMA domains and the GPU's group is not known; " } else { "" };
    // 2. Nothing registered with the kernel.
    if matches!(hardware, Some(h) if h.is_empty()) && matches!(groups, Some(g) if g.is_empty()) {
        return (
            Mode::Off,
            "/sys/class/iommu, /sys/kernel/iommu_groups (both empty)".to_string(),
            "no IOMMU is registered with the kernel and no device is in an IOMMU group".to_string(),
        );
    }
    // 3. The command line.
    if let Some((mode, tokens)) = cmdline_mode {
        return (*mode, "/proc/cmdline".to_string(), format!("{mixed_note}kernel command line: {tokens}"));
    }
    // 4. Unknown.
    let seen = match hardware {
        Some(h) if !h.is_empty() => format!("IOMMU hardware {} is registered", h.join(",")),
        _ => "no IOMMU information in /sys".to_string(),
    };
    (
        Mode::Unknown,
        "no decisive source".to_string(),
        format!("{mixed_note}{seen}; no domain types and no IOMMU parameters on the command line"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(c: &str) -> Option<Mode> {
        mode_from_cmdline(c).map(|(m, _)| m)
    }

    #[test]
    fn cmdline_modes() {
        assert_eq!(mode("ro quiet"), None);
        assert_eq!(mode("amd_iommu=off"), Some(Mode::Off));
        assert_eq!(mode("intel_iommu=on,sm_on"), None);
        assert_eq!(mode("intel_iommu=off"), Some(Mode::Off));
        assert_eq!(mode("iommu=pt"), Some(Mode::Passthrough));
        assert_eq!(mode("iommu.passthrough=1"), Some(Mode::Passthrough));
        assert_eq!(mode("iommu.passthrough=0"), Some(Mode::Translated));
        assert_eq!(mode("iommu=nopt"), Some(Mode::Translated));
        // Later parameters override earlier ones; off wins over everything.
        assert_eq!(mode("iommu=pt iommu.passthrough=0"), Some(Mode::Translated));
        assert_eq!(mode("iommu=pt amd_iommu=off"), Some(Mode::Off));
        // Arguments after `--` belong to init.
        assert_eq!(mode("quiet -- iommu=pt"), None);
    }
}
