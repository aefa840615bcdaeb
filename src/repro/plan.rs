//! `civetta repro plan`: the kernel command line and the steps for each IOMMU mode (from
//! docs/DEPLOY.md), ending in the `repro run` of each boot and the `repro merge` of all.
//! The IOMMU mode cannot change without a reboot, so one report is made per boot.

use std::fmt::Write;

/// One IOMMU mode: its name as `civetta env` reports it, what to add to the command line,
/// and the `iommu.mode` value to check for after the reboot.
pub struct IommuMode {
    pub name: &'static str,
    pub cmdline: &'static str,
    pub expect: &'static str,
}

pub const MODES: [IommuMode; 3] = [
    IommuMode {
        name: "default",
        cmdline: "",
        expect: "translated (passthrough if the kernel was built with CONFIG_IOMMU_DEFAULT_PASSTHROUGH)",
    },
    IommuMode { name: "passthrough", cmdline: "iommu=pt", expect: "passthrough" },
    IommuMode { name: "off", cmdline: "amd_iommu=off", expect: "off" },
];

/// The GTT/TTM parameters that let the GPU use `gib` GiB (DEPLOY.md's table: `gttsize` in
/// MiB, `ttm.*` in 4 KiB pages).
pub fn gtt_params(gib: u64) -> String {
    let pages = gib * 262_144;
    format!("amdgpu.gttsize={} ttm.pages_limit={pages} ttm.page_pool_size={pages}", gib * 1024)
}

/// The plan as text. `bench_args` are what each `repro run` passes to `civetta bench`;
/// `layers` the layers to run in each boot.
pub fn render(gib: u64, layers: &str, bench_args: &str) -> String {
    let gtt = gtt_params(gib);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "civetta repro plan: one boot per IOMMU mode, the same GTT size ({gib} GiB) and power settings in each,\n\
         one `civetta repro run` per boot, then `civetta repro merge` of the reports.\n"
    );
    s += "Before the first boot, fix everything that is not the IOMMU mode (check each with `civetta env`):\n";
    s += "  - power profile: powerprofilesctl set performance   (or: echo performance | sudo tee /sys/firmware/acpi/platform_profile)\n";
    s += "  - CPU governor:  sudo cpupower frequency-set -g performance   (amd-pstate-epp: also energy_performance_preference)\n";
    s += "  - GPU level:     leave power_dpm_force_performance_level at auto (or set the same value in every boot)\n";
    s += "  - the same kernel, firmware, image tag and toolbox container in every boot (no updates in between)\n\n";
    for (i, m) in MODES.iter().enumerate() {
        let line = if m.cmdline.is_empty() { gtt.clone() } else { format!("{} {gtt}", m.cmdline) };
        let _ = writeln!(s, "== boot {}: IOMMU {} ==", i + 1, m.name);
        let _ = writeln!(s, "kernel command line (add; remove the other modes' iommu parameters):\n  {line}");
        s += "set it:\n";
        let others: Vec<&str> = MODES.iter().map(|o| o.cmdline).filter(|c| !c.is_empty() && *c != m.cmdline).collect();
        let _ = writeln!(s, "  Fedora:        sudo grubby --update-kernel=ALL --remove-args=\"{}\" --args=\"{line}\"", others.join(" "));
        s += "  Debian/Ubuntu: edit GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub, then sudo update-grub\n";
        s += "  Fedora Atomic: sudo rpm-ostree kargs --delete-if-present=... --append-if-missing=... (one per parameter)\n";
        s += "reboot, then check:\n";
        let _ = writeln!(s, "  civetta env | grep -E 'iommu.mode|power_profile|governor|gtt_total'   # iommu.mode must be {}", m.expect);
        s += "run:\n";
        let _ = writeln!(s, "  civetta repro run --layers {layers} -o repro-iommu-{}.json -- {bench_args}\n", m.name);
    }
    s += "== after the last boot ==\n";
    s += "  civetta repro merge repro-iommu-default.json repro-iommu-passthrough.json repro-iommu-off.json\n";
    s += "The merged table's columns are labelled by the factors that differ (IOMMU mode, container layer);\n";
    s += "a column that differs from all others in two or more factors is flagged as confounded.\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gtt_params_match_the_deploy_table() {
        // docs/DEPLOY.md: 120 GiB = 122880 MiB = 31457280 pages.
        assert_eq!(gtt_params(120), "amdgpu.gttsize=122880 ttm.pages_limit=31457280 ttm.page_pool_size=31457280");
        assert_eq!(gtt_params(96), "amdgpu.gttsize=98304 ttm.pages_limit=25165824 ttm.page_pool_size=25165824");
    }

    #[test]
    fn every_mode_has_its_command_line_and_check() {
        let p = render(120, "host,podman,toolbox", "-m ~/models/model.gguf --backend hip");
        assert!(p.contains("\n  amdgpu.gttsize=122880 ttm.pages_limit=31457280"), "default mode adds only GTT: {p}");
        assert!(p.contains("  iommu=pt amdgpu.gttsize=122880"));
        assert!(p.contains("  amd_iommu=off amdgpu.gttsize=122880"));
        assert!(p.contains("iommu.mode must be off"));
        assert!(p.contains("--remove-args=\"amd_iommu=off\" --args=\"iommu=pt amdgpu"), "{p}");
        assert!(p.contains(
            "civetta repro run --layers host,podman,toolbox -o repro-iommu-passthrough.json -- -m ~/models/model.gguf --backend hip"
        ));
        assert!(p.contains("civetta repro merge repro-iommu-default.json"));
    }
}
