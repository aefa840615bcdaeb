//! GPUs (DRM cards and KFD topology nodes) and the amdgpu/ttm kernel parameters.
//!
//! A GPU is a `/sys/class/drm/cardN` (vendor, device id, driver, clocks, memory) joined
//! with its KFD node (`/sys/class/kfd/kfd/topology/nodes/*/properties`: gfx target, SIMDs)
//! by render minor (`drm_render_minor` vs `cardN/device/drm/renderD*`), else by a unique
//! PCI device id. KFD GPU nodes without a card (a container that sees /sys/class/kfd but
//! not /sys/class/drm) are listed on their own.

use super::{cmdline_params, list_dir, read_trimmed, Field, Probe};
use std::collections::BTreeMap;

pub(crate) fn is_card_name(name: &str) -> bool {
    name.strip_prefix("card").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `gfx_target_version` (major*10000 + minor*100 + stepping) -> `gfx<major><minor:x><stepping:x>`:
/// 110501 -> gfx1151, 90010 -> gfx90a, 90402 -> gfx942. `None` for 0 (a CPU node).
pub(crate) fn gfx_arch(target_version: u32) -> Option<String> {
    if target_version == 0 {
        return None;
    }
    let (major, minor, step) = (target_version / 10000, (target_version / 100) % 100, target_version % 100);
    Some(format!("gfx{major}{minor:x}{step:x}"))
}

/// The current clock of a `pp_dpm_*` file (the line marked `*`) and the range, in MHz.
pub(crate) fn parse_dpm(text: &str) -> (Option<u32>, Option<(u32, u32)>) {
    let mut current = None;
    let mut levels = Vec::new();
    for line in text.lines() {
        let Some((_, rest)) = line.split_once(':') else {
            continue;
        };
        let mhz = rest.trim().trim_end_matches('*').trim().to_ascii_lowercase();
        let Ok(v) = mhz.trim_end_matches("mhz").trim().parse::<u32>() else {
            continue;
        };
        levels.push(v);
        if line.trim_end().ends_with('*') {
            current = Some(v);
        }
    }
    let range = levels.iter().min().zip(levels.iter().max()).map(|(a, b)| (*a, *b));
    (current, range)
}

/// A KFD topology node's `properties` file: `name value` lines.
fn parse_properties(text: &str) -> BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once(' ')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

struct KfdNode {
    node: String,
    props: BTreeMap<String, String>,
    arch: String,
}

fn kfd_gpu_nodes(p: &Probe) -> Option<Vec<KfdNode>> {
    let nodes = list_dir(&p.sys("class/kfd/kfd/topology/nodes"))?;
    Some(
        nodes
            .into_iter()
            .filter_map(|n| {
                let text = read_trimmed(&p.sys(&format!("class/kfd/kfd/topology/nodes/{n}/properties")))?;
                let props = parse_properties(&text);
                let target = props.get("gfx_target_version")?.parse::<u32>().ok()?;
                let arch = gfx_arch(target)?;
                Some(KfdNode { node: n, props, arch })
            })
            .collect(),
    )
}

/// Looks a PCI vendor:device pair up in the pci.ids database under root.
fn pci_name(p: &Probe, vendor: &str, device: &str) -> Option<(String, String)> {
    let vendor = vendor.trim_start_matches("0x").to_ascii_lowercase();
    let device = device.trim_start_matches("0x").to_ascii_lowercase();
    for rel in ["usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids", "usr/share/pci.ids"] {
        let Ok(bytes) = std::fs::read(p.root(rel)) else {
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut in_vendor = false;
        for line in text.lines() {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            if !line.starts_with('\t') {
                in_vendor = line.to_ascii_lowercase().starts_with(&format!("{vendor}  "));
            } else if in_vendor && !line.starts_with("\t\t") {
                let l = line.trim_start();
                if l.to_ascii_lowercase().starts_with(&format!("{device}  ")) {
                    return Some((l[device.len()..].trim().to_string(), format!("/{rel}")));
                }
            }
        }
        return None;
    }
    None
}

pub(crate) fn collect(p: &Probe) -> Vec<Field> {
    let mut out = Vec::new();
    let cards: Option<Vec<String>> = list_dir(&p.sys("class/drm")).map(|v| v.into_iter().filter(|c| is_card_name(c)).collect());
    let kfd = kfd_gpu_nodes(p);
    let mut kfd_used = vec![false; kfd.as_ref().map_or(0, Vec::len)];
    let mut archs: Vec<String> = Vec::new();
    let mut count = 0usize;

    for card in cards.iter().flatten() {
        let idx = count;
        count += 1;
        let dev = |f: &str| p.sys(&format!("class/drm/{card}/device/{f}"));
        let src = |f: &str| format!("/sys/class/drm/{card}/device/{f}");
        let key = |k: &str| format!("gpu.{idx}.{k}");
        out.push(Field::new(key("card"), card.clone(), format!("/sys/class/drm/{card}")));

        let vendor = read_trimmed(&dev("vendor"));
        let device_id = read_trimmed(&dev("device"));
        out.push(match vendor.as_deref() {
            Some("0x1002") => Field::new(key("vendor"), "AMD (0x1002)", src("vendor")),
            Some("0x10de") => Field::new(key("vendor"), "NVIDIA (0x10de)", src("vendor")),
            Some("0x8086") => Field::new(key("vendor"), "Intel (0x8086)", src("vendor")),
            Some(v) => Field::new(key("vendor"), v, src("vendor")),
            None => Field::unknown(key("vendor"), format!("{} (not readable)", src("vendor"))),
        });
        out.push(match &device_id {
            Some(d) => Field::new(key("device_id"), d.clone(), src("device")),
            None => Field::unknown(key("device_id"), format!("{} (not readable)", src("device"))),
        });
        out.push(gpu_name(p, card, vendor.as_deref(), device_id.as_deref(), &key("name")));
        out.push(driver_field(p, card, &key("driver")));

        let (current, range) = read_trimmed(&dev("pp_dpm_sclk")).map(|t| parse_dpm(&t)).unwrap_or((None, None));
        out.push(match current {
            Some(c) => Field::new(key("sclk_mhz"), c.to_string(), format!("{} (line marked *)", src("pp_dpm_sclk"))),
            None => Field::unknown(key("sclk_mhz"), format!("{} (not readable or no current level)", src("pp_dpm_sclk"))),
        });
        out.push(match range {
            Some((lo, hi)) => Field::new(key("sclk_range_mhz"), format!("{lo}-{hi}"), src("pp_dpm_sclk")),
            None => Field::unknown(key("sclk_range_mhz"), format!("{} (not readable)", src("pp_dpm_sclk"))),
        });
        for (file, name) in [
            ("mem_info_vram_total", "vram_total_bytes"),
            ("mem_info_gtt_total", "gtt_total_bytes"),
            ("mem_info_gtt_used", "gtt_used_bytes"),
        ] {
            out.push(match read_trimmed(&dev(file)).filter(|v| v.parse::<u64>().is_ok()) {
                Some(v) => Field::new(key(name), v, src(file)),
                None => Field::unknown(key(name), format!("{} (not readable)", src(file))),
            });
        }
        out.push(match read_trimmed(&dev("power_dpm_force_performance_level")) {
            Some(v) if !v.is_empty() => Field::new(key("perf_level"), v, src("power_dpm_force_performance_level")),
            _ => Field::unknown(key("perf_level"), format!("{} (not readable)", src("power_dpm_force_performance_level"))),
        });
        out.push(match read_trimmed(&dev("pp_power_profile_mode")).map(|t| active_power_profile(&t)) {
            Some(Some(mode)) => Field::new(key("power_profile_mode"), mode, format!("{} (line marked *)", src("pp_power_profile_mode"))),
            Some(None) => Field::unknown(key("power_profile_mode"), format!("{} (no line marked *)", src("pp_power_profile_mode"))),
            None => Field::unknown(key("power_profile_mode"), format!("{} (not readable)", src("pp_power_profile_mode"))),
        });
        out.push(firmware_field(p, card, &key("firmware")));
        out.push(match read_trimmed(&dev("vbios_version")).filter(|v| !v.is_empty()) {
            Some(v) => Field::new(key("vbios"), v, src("vbios_version")),
            None => Field::unknown(key("vbios"), format!("{} (not readable)", src("vbios_version"))),
        });

        // The KFD node of this card.
        let render_minors: Vec<String> =
            list_dir(&dev("drm")).unwrap_or_default().into_iter().filter_map(|e| e.strip_prefix("renderD").map(str::to_string)).collect();
        let matched = kfd.as_ref().and_then(|nodes| {
            let by_minor = nodes.iter().position(|n| n.props.get("drm_render_minor").is_some_and(|m| render_minors.contains(m)));
            by_minor.or_else(|| {
                let id = device_id.as_deref().and_then(|d| u32::from_str_radix(d.trim_start_matches("0x"), 16).ok())?;
                let same: Vec<usize> =
                    (0..nodes.len()).filter(|&i| nodes[i].props.get("device_id").and_then(|v| v.parse::<u32>().ok()) == Some(id)).collect();
                (same.len() == 1).then(|| same[0])
            })
        });
        match (matched, &kfd) {
            (Some(i), Some(nodes)) => {
                kfd_used[i] = true;
                archs.push(nodes[i].arch.clone());
                out.extend(kfd_fields(&nodes[i], idx));
            }
            _ => out.push(Field::unknown(
                key("arch"),
                if kfd.is_some() { "no KFD topology node matches this card" } else { "/sys/class/kfd/kfd/topology/nodes (not readable)" },
            )),
        }
    }
    // KFD GPU nodes without a DRM card.
    if let Some(nodes) = &kfd {
        for (_, node) in nodes.iter().enumerate().filter(|(i, _)| !kfd_used[*i]) {
            archs.push(node.arch.clone());
            out.extend(kfd_fields(node, count));
            count += 1;
        }
    }

    // Without /sys/class/drm and /sys/class/kfd, a readable /sys/class means no GPU driver
    // registered a device; without /sys/class we cannot tell.
    let sys_class_readable = p.sys("class").is_dir();
    out.insert(
        0,
        if cards.is_some() || kfd.is_some() {
            Field::new("gpu.count", count.to_string(), "/sys/class/drm/card*, /sys/class/kfd/kfd/topology/nodes")
        } else if sys_class_readable {
            Field::new("gpu.count", "0", "/sys/class (no drm or kfd class)")
        } else {
            Field::unknown("gpu.count", "/sys/class (not readable)")
        },
    );
    let mut distinct: Vec<String> = Vec::new();
    for a in archs {
        if !distinct.contains(&a) {
            distinct.push(a);
        }
    }
    let arch_field = if !distinct.is_empty() {
        Field::new("gpu.arch", distinct.join(","), "/sys/class/kfd/kfd/topology/nodes/*/properties gfx_target_version")
    } else if count > 0 {
        Field::unknown("gpu.arch", "no KFD topology node for the GPUs found")
    } else if sys_class_readable {
        Field::new("gpu.arch", "none", "no GPU in /sys/class/drm or /sys/class/kfd")
    } else {
        Field::unknown("gpu.arch", "/sys/class (not readable)")
    };
    out.insert(1, arch_field);
    out.push(if p.root("dev/kfd").exists() {
        Field::new("gpu.dev_kfd", "present", "/dev/kfd")
    } else {
        Field::new("gpu.dev_kfd", "absent", "/dev/kfd")
    });
    out.push(match list_dir(&p.root("dev/dri")) {
        Some(e) => {
            let render: Vec<String> = e.into_iter().filter(|n| n.starts_with("renderD")).collect();
            Field::new("gpu.dev_dri_render", if render.is_empty() { "none".into() } else { render.join(",") }, "/dev/dri")
        }
        None => Field::new("gpu.dev_dri_render", "absent", "/dev/dri"),
    });
    out.extend(kernel_params(p));
    out
}

/// The active workload profile of a `pp_power_profile_mode` file: the name on the line whose
/// name ends with `*`. The layouts differ by SMU generation (`  1 3D_FULL_SCREEN*:` with a
/// table below it, ` 5        COMPUTE*` on APUs); only the `index name[*]` lines matter.
pub(crate) fn active_power_profile(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let line = line.trim_start();
        let (index, rest) = line.split_once(char::is_whitespace)?;
        index.parse::<u32>().ok()?;
        let head = rest.split(':').next()?.trim();
        head.strip_suffix('*').map(|name| name.trim().to_string()).filter(|n| !n.is_empty())
    })
}

/// The versions of the firmware amdgpu loaded (`device/fw_version/<name>_fw_version`, world
/// readable, unlike debugfs's amdgpu_firmware_info), one `name=version` list so that a
/// firmware update shows up as one changed field.
fn firmware_field(p: &Probe, card: &str, key: &str) -> Field {
    let rel = format!("class/drm/{card}/device/fw_version");
    let source = format!("/sys/{rel}/*_fw_version");
    let Some(files) = list_dir(&p.sys(&rel)) else {
        return Field::unknown(key, format!("{source} (not readable)"));
    };
    let mut versions: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let name = f.strip_suffix("_fw_version")?;
            let v = read_trimmed(&p.sys(&format!("{rel}/{f}")))?;
            Some(format!("{name}={v}"))
        })
        .collect();
    versions.sort();
    if versions.is_empty() {
        Field::unknown(key, format!("{source} (no readable version files)"))
    } else {
        Field::new(key, versions.join(","), source)
    }
}

fn gpu_name(p: &Probe, card: &str, vendor: Option<&str>, device: Option<&str>, key: &str) -> Field {
    if let Some(name) = read_trimmed(&p.sys(&format!("class/drm/{card}/device/product_name"))).filter(|n| !n.is_empty()) {
        return Field::new(key, name, format!("/sys/class/drm/{card}/device/product_name"));
    }
    match (vendor, device) {
        (Some(v), Some(d)) => match pci_name(p, v, d) {
            Some((name, src)) => Field::new(key, name, format!("{src} ({v}:{d})")),
            None => Field::unknown(key, format!("no product_name and no pci.ids entry for {v}:{d}")),
        },
        _ => Field::unknown(key, "vendor/device id not readable"),
    }
}

/// The driver: the name of the `device/driver` symlink's target, else `DRIVER=` in uevent.
fn driver_field(p: &Probe, card: &str, key: &str) -> Field {
    if let Ok(target) = std::fs::read_link(p.sys(&format!("class/drm/{card}/device/driver"))) {
        if let Some(name) = target.file_name() {
            return Field::new(key, name.to_string_lossy(), format!("/sys/class/drm/{card}/device/driver (symlink)"));
        }
    }
    let uevent = read_trimmed(&p.sys(&format!("class/drm/{card}/device/uevent")));
    match uevent.as_deref().and_then(|u| u.lines().find_map(|l| l.strip_prefix("DRIVER="))) {
        Some(d) => Field::new(key, d, format!("/sys/class/drm/{card}/device/uevent DRIVER=")),
        None => Field::unknown(key, format!("/sys/class/drm/{card}/device/driver (not readable)")),
    }
}

fn kfd_fields(node: &KfdNode, idx: usize) -> Vec<Field> {
    let src = format!("/sys/class/kfd/kfd/topology/nodes/{}/properties", node.node);
    let key = |k: &str| format!("gpu.{idx}.{k}");
    let prop = |name: &str, k: &str| match node.props.get(name) {
        Some(v) => Field::new(key(k), v.clone(), format!("{src} {name}")),
        None => Field::unknown(key(k), format!("{src} (no {name})")),
    };
    let cus = node
        .props
        .get("simd_count")
        .and_then(|s| s.parse::<u32>().ok())
        .zip(node.props.get("simd_per_cu").and_then(|s| s.parse::<u32>().ok()).filter(|&n| n > 0))
        .map(|(s, per)| s / per);
    vec![
        Field::new(key("arch"), node.arch.clone(), format!("{src} gfx_target_version={}", node.props["gfx_target_version"])),
        Field::new(key("kfd_node"), node.node.clone(), src.clone()),
        prop("simd_count", "simd_count"),
        prop("array_count", "array_count"),
        match cus {
            Some(c) => Field::new(key("compute_units"), c.to_string(), format!("{src} simd_count / simd_per_cu")),
            None => Field::unknown(key("compute_units"), format!("{src} (no simd_count or simd_per_cu)")),
        },
    ]
}

/// The amdgpu/ttm parameters Strix Halo users set to size the unified memory the GPU may
/// use: the value the module runs with (/sys/module) and what the command line asked for.
fn kernel_params(p: &Probe) -> Vec<Field> {
    let mut out = Vec::new();
    let params = p.cmdline.as_deref().map(cmdline_params).unwrap_or_default();
    for (module, param) in [("amdgpu", "gttsize"), ("ttm", "pages_limit"), ("ttm", "page_pool_size")] {
        let sys_src = format!("/sys/module/{module}/parameters/{param}");
        out.push(match read_trimmed(&p.sys(&format!("module/{module}/parameters/{param}"))) {
            Some(v) => Field::new(format!("kparam.{module}.{param}"), v, sys_src),
            None => {
                Field::unknown(format!("kparam.{module}.{param}"), format!("{sys_src} (absent: module not loaded or no such parameter)"))
            }
        });
        let name = format!("{module}.{param}");
        let key = format!("kparam.{module}.{param}.cmdline");
        out.push(match (&p.cmdline, params.iter().rev().find(|(k, _)| *k == name)) {
            (None, _) => Field::unknown(key, "/proc/cmdline (not readable)"),
            (Some(_), Some((_, v))) => Field::new(key, *v, format!("/proc/cmdline {name}=")),
            (Some(_), None) => Field::new(key, "not set", format!("/proc/cmdline (no {name}=)")),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_arch_names() {
        assert_eq!(gfx_arch(110501).as_deref(), Some("gfx1151"));
        assert_eq!(gfx_arch(110000).as_deref(), Some("gfx1100"));
        assert_eq!(gfx_arch(90010).as_deref(), Some("gfx90a"));
        assert_eq!(gfx_arch(90402).as_deref(), Some("gfx942"));
        assert_eq!(gfx_arch(0), None);
    }

    #[test]
    fn dpm_current_and_range() {
        let (cur, range) = parse_dpm("0: 600Mhz \n1: 1200Mhz *\n2: 2900Mhz \n");
        assert_eq!(cur, Some(1200));
        assert_eq!(range, Some((600, 2900)));
        assert_eq!(parse_dpm("garbage"), (None, None));
    }

    #[test]
    fn power_profile_mode_layouts() {
        // APU (SMU 11/14): name and marker on one line.
        let apu = " 0 BOOTUP_DEFAULT \n 1 3D_FULL_SCREEN \n 2   POWER_SAVING \n 5        COMPUTE*\n 6         CUSTOM \n";
        assert_eq!(active_power_profile(apu).as_deref(), Some("COMPUTE"));
        // dGPU (SMU 13): a header, `index name*:` lines and indented clock rows.
        let dgpu = "PROFILE_INDEX(NAME) CLOCK_TYPE(NAME) FPS MinActiveFreqType\n 0 BOOTUP_DEFAULT*:\n                  0(       GFXCLK)       0       5\n 1 3D_FULL_SCREEN :\n";
        assert_eq!(active_power_profile(dgpu).as_deref(), Some("BOOTUP_DEFAULT"));
        // Vega: `NUM MODE_NAME ...` header, values after the colon.
        let vega = "NUM        MODE_NAME BUSY_SET_POINT FPS\n  0 BOOTUP_DEFAULT :    70  60\n  1 3D_FULL_SCREEN*:    70  60\n";
        assert_eq!(active_power_profile(vega).as_deref(), Some("3D_FULL_SCREEN"));
        assert_eq!(active_power_profile(" 0 BOOTUP_DEFAULT\n"), None);
    }

    #[test]
    fn card_names() {
        assert!(is_card_name("card0"));
        assert!(is_card_name("card12"));
        assert!(!is_card_name("card0-DP-1"));
        assert!(!is_card_name("renderD128"));
        assert!(!is_card_name("card"));
    }
}
