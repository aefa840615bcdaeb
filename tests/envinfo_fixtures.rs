//! The environment fingerprint read from fixture trees (tests/fixtures/env/<name>): each
//! IOMMU mode, each container layer, and a Strix Halo GPU.

use civetta::envinfo::{collect, CollectOptions, Fingerprint};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/env").join(name)
}

fn fp(name: &str) -> Fingerprint {
    collect(&CollectOptions::fixture(fixture_dir(name), "cpu"))
}

fn fp_with_env(name: &str, vars: &[(&str, &str)]) -> Fingerprint {
    let mut opts = CollectOptions::fixture(fixture_dir(name), "cpu");
    opts.env_vars = Some(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>());
    collect(&opts)
}

fn value<'a>(f: &'a Fingerprint, key: &str) -> &'a str {
    f.get(key).unwrap_or_else(|| panic!("no field {key}; fields: {:#?}", f.fields))
}

fn source<'a>(f: &'a Fingerprint, key: &str) -> &'a str {
    &f.field(key).unwrap_or_else(|| panic!("no field {key}")).source
}

// ---------------------------------------------------------------- IOMMU

#[test]
fn iommu_off_from_the_command_line() {
    let f = fp("iommu-off-cmdline");
    assert_eq!(f.iommu_mode, "off");
    assert_eq!(source(&f, "iommu.mode"), "/proc/cmdline");
    assert_eq!(value(&f, "iommu.cmdline"), "amd_iommu=off");
    assert_eq!(value(&f, "iommu.group_count"), "unknown");
}

#[test]
fn iommu_passthrough_from_identity_groups() {
    let f = fp("iommu-passthrough-groups");
    assert_eq!(f.iommu_mode, "passthrough");
    assert_eq!(source(&f, "iommu.mode"), "/sys/kernel/iommu_groups/*/type");
    assert_eq!(value(&f, "iommu.group_count"), "3");
    assert_eq!(value(&f, "iommu.domain_types"), "identity:3");
    assert_eq!(value(&f, "iommu.hardware"), "ivhd0");
    assert_eq!(value(&f, "iommu.cmdline"), "none");
}

#[test]
fn iommu_passthrough_from_iommu_pt_without_groups() {
    let f = fp("iommu-pt-cmdline-no-groups");
    assert_eq!(f.iommu_mode, "passthrough");
    assert_eq!(source(&f, "iommu.mode"), "/proc/cmdline");
    assert_eq!(value(&f, "iommu.cmdline"), "iommu=pt");
    assert!(value(&f, "iommu.evidence").contains("iommu=pt"));
}

#[test]
fn iommu_translated_groups_win_over_the_command_line() {
    // The command line asks for iommu.passthrough=1, the kernel gave DMA-FQ domains.
    let f = fp("iommu-translated-dmafq");
    assert_eq!(f.iommu_mode, "translated");
    assert_eq!(source(&f, "iommu.mode"), "/sys/kernel/iommu_groups/*/type");
    assert_eq!(value(&f, "iommu.cmdline"), "iommu.passthrough=1");
    // A VFIO (unmanaged) group is counted in the list but does not decide the mode.
    assert_eq!(value(&f, "iommu.domain_types"), "DMA-FQ:4,unmanaged:1");
    assert_eq!(value(&f, "iommu.group_count"), "5");
}

#[test]
fn iommu_off_when_nothing_is_registered_even_with_iommu_pt() {
    let f = fp("iommu-none-registered");
    assert_eq!(f.iommu_mode, "off");
    assert_eq!(value(&f, "iommu.hardware"), "none");
    assert_eq!(value(&f, "iommu.group_count"), "0");
    assert!(source(&f, "iommu.mode").contains("both empty"), "{}", source(&f, "iommu.mode"));
    // /sys/class is readable and has no drm or kfd class: no GPU, a fact.
    assert_eq!(value(&f, "gpu.count"), "0");
    assert_eq!(f.gpu_arch, "none");
}

#[test]
fn iommu_unknown_when_nothing_is_readable() {
    let f = fp("iommu-unknown");
    assert_eq!(f.iommu_mode, "unknown");
    for key in ["iommu.hardware", "iommu.group_count", "iommu.domain_types", "iommu.cmdline"] {
        assert_eq!(value(&f, key), "unknown", "{key}");
    }
    // And so is everything else host-related: nothing is guessed.
    for key in [
        "host.kernel_release",
        "host.cmdline",
        "cpu.model",
        "host.memory_total_bytes",
        "host.os",
        "gpu.count",
        "gpu.arch",
        "container.type",
    ] {
        assert_eq!(value(&f, key), "unknown", "{key}");
    }
    assert_eq!(f.kernel_release, "unknown");
}

// ---------------------------------------------------------------- containers

#[test]
fn container_none_despite_a_stray_dockerenv() {
    let f = fp("container-none-stray-dockerenv");
    assert_eq!(f.container, "none");
    assert!(value(&f, "container.evidence").contains("/.dockerenv exists but"), "{}", value(&f, "container.evidence"));
    assert_eq!(value(&f, "container.image"), "none");
    assert_eq!(value(&f, "container.engine"), "none");
}

#[test]
fn container_podman_with_containerenv_fields_and_image_json() {
    let f = fp("container-podman");
    assert_eq!(f.container, "podman");
    assert_eq!(source(&f, "container.type"), "/run/.containerenv");
    assert_eq!(value(&f, "container.engine"), "podman-4.3.1");
    assert_eq!(value(&f, "container.name"), "civetta-test");
    assert_eq!(value(&f, "container.rootless"), "1");
    assert!(value(&f, "container.id").starts_with("5b2f0c2a"));
    // image.json's tag wins over .containerenv's image=.
    assert_eq!(f.image, "civetta:rocm-7.1.1-clang20");
    assert_eq!(source(&f, "container.image"), "/etc/civetta/image.json tag");
    assert_eq!(value(&f, "container.image_revision"), "0123456789abcdef0123456789abcdef01234567");
    assert_eq!(value(&f, "container.label.civetta.clang.version"), "20");
    assert_eq!(value(&f, "container.label.civetta.rocm.version"), "7.1.1");
}

#[test]
fn container_podman_from_an_empty_containerenv_and_libpod_cgroup() {
    let f = fp("container-podman-empty");
    assert_eq!(f.container, "podman");
    let ev = value(&f, "container.evidence");
    assert!(ev.contains("/run/.containerenv exists (empty)") && ev.contains("libpod"), "{ev}");
    // Without --privileged podman leaves the fields out: unknown, not guessed.
    assert_eq!(value(&f, "container.engine"), "unknown");
    assert_eq!(f.image, "unknown");
}

#[test]
fn container_docker_needs_cgroup_or_mount_evidence() {
    let v1 = fp("container-docker");
    assert_eq!(v1.container, "docker");
    assert_eq!(source(&v1, "container.type"), "/.dockerenv + /proc/1/cgroup");
    let v2 = fp("container-docker-cgroupv2");
    assert_eq!(v2.container, "docker");
    assert_eq!(source(&v2, "container.type"), "/.dockerenv + /proc/self/mountinfo");
}

#[test]
fn container_toolbox() {
    let f = fp("container-toolbox");
    assert_eq!(f.container, "toolbox");
    assert_eq!(source(&f, "container.type"), "/run/.toolboxenv");
    assert_eq!(value(&f, "container.name"), "civetta-7.1.1");
    assert_eq!(f.image, "localhost/civetta:rocm-7.1.1-clang20-toolbox");
    assert_eq!(source(&f, "container.image"), "/run/.containerenv image=");
    assert_eq!(value(&f, "host.os"), "Ubuntu 24.04.3 LTS");
    assert_eq!(value(&f, "host.outer_os"), "Fedora Linux 43 (Workstation Edition)");
}

#[test]
fn container_distrobox_from_its_files_despite_toolboxenv() {
    let f = fp("container-distrobox");
    assert_eq!(f.container, "distrobox");
    assert_eq!(source(&f, "container.type"), "/etc/profile.d/distrobox_profile.sh");
    assert_eq!(value(&f, "container.name"), "civetta-box");
    assert_eq!(value(&f, "container.engine"), "podman-5.6.2");
}

#[test]
fn container_distrobox_from_its_environment() {
    // distrobox create sets container=podman and CONTAINER_ID=<name>.
    let f = fp_with_env("container-podman-empty", &[("container", "podman"), ("CONTAINER_ID", "civetta-box")]);
    assert_eq!(f.container, "distrobox");
    assert_eq!(source(&f, "container.type"), "env CONTAINER_ID");
    // CONTAINER_ID alone, with no sign of a container, proves nothing.
    let g = fp_with_env("container-none-stray-dockerenv", &[("CONTAINER_ID", "x")]);
    assert_eq!(g.container, "none");
}

#[test]
fn container_environment_variable_alone() {
    assert_eq!(fp_with_env("container-none-stray-dockerenv", &[("container", "podman")]).container, "podman");
    assert_eq!(fp_with_env("container-none-stray-dockerenv", &[("container", "systemd-nspawn")]).container, "unknown");
}

// ---------------------------------------------------------------- Strix Halo

#[test]
fn strix_halo_gpu() {
    let f = fp("strix-halo");
    assert_eq!(value(&f, "gpu.count"), "1");
    assert_eq!(f.gpu_arch, "gfx1151");
    assert_eq!(value(&f, "gpu.0.card"), "card1");
    assert_eq!(value(&f, "gpu.0.vendor"), "AMD (0x1002)");
    assert_eq!(value(&f, "gpu.0.device_id"), "0x1586");
    assert_eq!(value(&f, "gpu.0.name"), "Strix Halo [Radeon Graphics / Radeon 8050S / 8060S Graphics]");
    assert_eq!(value(&f, "gpu.0.driver"), "amdgpu");
    assert_eq!(source(&f, "gpu.0.driver"), "/sys/class/drm/card1/device/driver (symlink)");
    assert_eq!(value(&f, "gpu.0.sclk_mhz"), "1781");
    assert_eq!(value(&f, "gpu.0.sclk_range_mhz"), "600-2900");
    assert_eq!(value(&f, "gpu.0.vram_total_bytes"), "536870912");
    assert_eq!(value(&f, "gpu.0.gtt_total_bytes"), "130056978432");
    assert_eq!(value(&f, "gpu.0.perf_level"), "auto");
    // KFD node 1 (node 0 is the CPU), matched by render minor 128.
    assert_eq!(value(&f, "gpu.0.kfd_node"), "1");
    assert_eq!(value(&f, "gpu.0.simd_count"), "80");
    assert_eq!(value(&f, "gpu.0.array_count"), "4");
    assert_eq!(value(&f, "gpu.0.compute_units"), "40");
    assert!(source(&f, "gpu.0.arch").contains("gfx_target_version=110501"));
    assert_eq!(value(&f, "gpu.dev_kfd"), "present");
    assert_eq!(value(&f, "gpu.dev_dri_render"), "renderD128");
    // The connector directory card1-eDP-1 is not a GPU.
    assert!(f.get("gpu.1.card").is_none());
}

#[test]
fn strix_halo_kernel_parameters_from_sysfs_and_cmdline() {
    let f = fp("strix-halo");
    assert_eq!(value(&f, "kparam.amdgpu.gttsize"), "126976");
    assert_eq!(source(&f, "kparam.amdgpu.gttsize"), "/sys/module/amdgpu/parameters/gttsize");
    assert_eq!(value(&f, "kparam.amdgpu.gttsize.cmdline"), "126976");
    assert_eq!(value(&f, "kparam.ttm.pages_limit"), "32505856");
    assert_eq!(value(&f, "kparam.ttm.page_pool_size.cmdline"), "32505856");
    assert_eq!(source(&f, "kparam.ttm.pages_limit.cmdline"), "/proc/cmdline ttm.pages_limit=");
    // Elsewhere: the module is not loaded (unknown) and the command line does not set it.
    let g = fp("container-podman");
    assert_eq!(value(&g, "kparam.ttm.pages_limit"), "unknown");
    assert_eq!(value(&g, "kparam.ttm.pages_limit.cmdline"), "not set");
}

#[test]
fn strix_halo_host_toolchain_and_iommu() {
    let f = fp("strix-halo");
    assert_eq!(f.cpu_model, "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S");
    assert_eq!(value(&f, "cpu.logical_cpus"), "4");
    assert_eq!(value(&f, "cpu.cores"), "2");
    assert_eq!(value(&f, "host.memory_total_bytes"), (131072000u64 * 1024).to_string());
    assert_eq!(value(&f, "host.governor"), "performance");
    assert_eq!(value(&f, "host.power_profile"), "performance");
    assert_eq!(value(&f, "host.os"), "Fedora Linux 43 (Workstation Edition)");
    assert_eq!(f.kernel_release, "6.17.7-300.fc43.x86_64");
    // Two kernel builds with the same compiler report it once.
    assert_eq!(value(&f, "toolchain.kernel_compiler"), "clang version 22.1.8 (https://github.com/llvm/llvm-project 0123abc)");
    assert_eq!(f.kernel_compiler, "clang 22.1.8");
    assert!(source(&f, "toolchain.kernel_compiler").contains("2 builds"));
    assert_eq!(value(&f, "toolchain.rocm_installed"), "7.1.1-38");
    assert_eq!(f.rocm, "7.1.1-38", "no HIP runtime: the installed ROCm is the summary");
    // Groups are mixed (one DMA group); the GPU's own group (4, identity) decides.
    assert_eq!(f.iommu_mode, "passthrough");
    assert_eq!(source(&f, "iommu.mode"), "/sys/class/drm/card1/device/iommu_group/type");
    assert_eq!(value(&f, "iommu.domain_types"), "DMA:1,identity:4");
    assert_eq!(f.container, "none");
}

#[test]
fn no_gpu_and_no_kernel_build() {
    let f = fp("container-podman");
    assert_eq!(value(&f, "gpu.count"), "unknown", "the fixture has no /sys at all");
    assert_eq!(value(&f, "gpu.dev_kfd"), "absent");
    assert_eq!(value(&f, "toolchain.kernel_compiler"), "none");
    assert!(source(&f, "toolchain.kernel_compiler").starts_with("no kernel build found"));
    assert_eq!(value(&f, "toolchain.hip_runtime"), "unknown");
    assert_eq!(source(&f, "toolchain.hip_runtime"), "HIP backend not present");
    assert_eq!(value(&f, "toolchain.rocm_installed"), "none");
}

#[test]
fn kernel_compiler_from_the_environment_when_no_directory_is_given() {
    let mut opts = CollectOptions::fixture(fixture_dir("container-podman"), "hip");
    opts.kernel_build_dir = None;
    opts.env_vars = Some([("CIVETTA_KERNEL_COMPILER".to_string(), "AMD clang version 19.0.0git (roc-6.4.4)".to_string())].into());
    opts.hip_runtime_version = Some("6.4.43484".into());
    let f = collect(&opts);
    assert_eq!(f.kernel_compiler, "AMD clang 19.0.0git");
    assert_eq!(source(&f, "toolchain.kernel_compiler"), "env CIVETTA_KERNEL_COMPILER");
    assert_eq!(f.rocm, "6.4.43484");
    assert_eq!(f.backend, "hip");
    // CIVETTA_KERNEL_DIR points at a build.
    let mut opts = CollectOptions::fixture(fixture_dir("container-podman"), "hip");
    opts.kernel_build_dir = None;
    let dir = fixture_dir("strix-halo").join("build/kernels");
    opts.env_vars = Some([("CIVETTA_KERNEL_DIR".to_string(), dir.display().to_string())].into());
    assert_eq!(collect(&opts).kernel_compiler, "clang 22.1.8");
}

// ---------------------------------------------------------------- power and memory settings

#[test]
fn strix_halo_power_settings() {
    let f = fp("strix-halo");
    assert_eq!(value(&f, "host.power_profile"), "performance");
    assert_eq!(source(&f, "host.power_profile"), "/sys/firmware/acpi/platform_profile");
    assert_eq!(value(&f, "host.energy_perf_preference"), "balance_performance");
    assert_eq!(source(&f, "host.energy_perf_preference"), "/sys/devices/system/cpu/cpu0/cpufreq/energy_performance_preference");
    assert_eq!(value(&f, "host.cpufreq_driver"), "amd-pstate-epp");
    assert_eq!(value(&f, "gpu.0.perf_level"), "auto");
    assert_eq!(source(&f, "gpu.0.perf_level"), "/sys/class/drm/card1/device/power_dpm_force_performance_level");
    assert_eq!(value(&f, "gpu.0.power_profile_mode"), "COMPUTE");
    assert_eq!(source(&f, "gpu.0.power_profile_mode"), "/sys/class/drm/card1/device/pp_power_profile_mode (line marked *)");
    // Where the files are missing: unknown, with the path that was tried.
    let g = fp("container-podman");
    assert_eq!(value(&g, "host.energy_perf_preference"), "unknown");
    assert!(source(&g, "host.energy_perf_preference").ends_with("(not readable)"));
    assert_eq!(value(&g, "host.power_profile"), "unknown");
}

#[test]
fn strix_halo_memory_settings() {
    let f = fp("strix-halo");
    assert_eq!(value(&f, "gpu.0.gtt_total_bytes"), "130056978432");
    assert_eq!(value(&f, "gpu.0.gtt_used_bytes"), "2151677952");
    assert_eq!(source(&f, "gpu.0.gtt_used_bytes"), "/sys/class/drm/card1/device/mem_info_gtt_used");
    // GTT in use changes from run to run: compare may leave it out.
    assert!(civetta::envinfo::is_volatile("gpu.0.gtt_used_bytes"));
    assert_eq!(value(&f, "kparam.ttm.pages_limit"), "32505856");
    assert_eq!(value(&f, "kparam.ttm.page_pool_size"), "32505856");
    assert_eq!(source(&f, "kparam.ttm.page_pool_size"), "/sys/module/ttm/parameters/page_pool_size");
    assert_eq!(value(&f, "host.thp"), "madvise");
    assert_eq!(source(&f, "host.thp"), "/sys/kernel/mm/transparent_hugepage/enabled [selected]");
    assert_eq!(value(&f, "host.thp_defrag"), "madvise");
    let g = fp("container-podman");
    assert_eq!(value(&g, "host.thp"), "unknown");
}

#[test]
fn strix_halo_firmware_and_kernel_build() {
    let f = fp("strix-halo");
    // Sorted by name: one field that changes with any firmware update.
    assert_eq!(value(&f, "gpu.0.firmware"), "me=0x00000020,mec=0x0000001f,smc=0x004a0d00,sos=0x00000000,vcn=0x0802100c");
    assert_eq!(source(&f, "gpu.0.firmware"), "/sys/class/drm/card1/device/fw_version/*_fw_version");
    assert_eq!(value(&f, "gpu.0.vbios"), "113-STRXLGEN-001");
    assert_eq!(value(&f, "host.kernel_release"), "6.17.7-300.fc43.x86_64");
    assert_eq!(value(&f, "host.kernel_version"), "#1 SMP PREEMPT_DYNAMIC Mon Nov  3 16:52:36 UTC 2025");
    assert_eq!(source(&f, "host.kernel_version"), "/proc/sys/kernel/version");
}

#[test]
fn dashboard_labels_carry_the_power_and_memory_settings() {
    let labels = fp("strix-halo").info_labels();
    let label = |k: &str| labels.iter().find(|(n, _)| n == k).unwrap_or_else(|| panic!("no label {k}")).1.clone();
    assert_eq!(label("power_profile"), "performance");
    assert_eq!(label("governor"), "performance");
    assert_eq!(label("epp"), "balance_performance");
    assert_eq!(label("gpu_perf_level"), "auto");
    assert_eq!(label("gtt_total_bytes"), "130056978432");
    assert_eq!(label("kernel"), "6.17.7-300.fc43.x86_64");
    assert_eq!(label("thp"), "madvise");
}

// ---------------------------------------------------------------- confounding

/// Two Strix Halo boots: IOMMU passthrough + performance profile, and IOMMU off + balanced.
#[test]
fn two_factors_changed_the_warning_names_both() {
    use civetta::envinfo::factors::{changed, confounding_warning, differing_factors};
    let a = fp("strix-halo");
    let b = fp("strix-halo-iommu-off-balanced");
    assert_eq!((a.iommu_mode.as_str(), b.iommu_mode.as_str()), ("passthrough", "off"));
    let diff: Vec<(&str, &str, &str)> = a.diff(&b);
    let factors = differing_factors(&diff);
    let names: Vec<&str> = changed(&factors).iter().map(|f| f.factor).collect();
    assert_eq!(names, ["IOMMU mode", "power profile"]);
    let w = confounding_warning(&factors).expect("two factors differ");
    assert!(w.contains("IOMMU mode") && w.contains("power profile"), "{w}");
    assert!(w.contains("iommu.mode: passthrough vs off") && w.contains("host.power_profile: performance vs balanced"), "{w}");

    // `civetta compare` on two reports carrying these fingerprints prints it.
    let base_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bench/base.json");
    let mut base = civetta::bench::cli::load_report(&base_path).unwrap();
    let mut new = base.clone();
    base.fingerprint = a.to_json();
    new.fingerprint = b.to_json();
    let text = civetta::bench::compare::compare(&base, &new).text;
    assert!(text.contains("WARNING: confounded") && text.contains("(IOMMU mode, power profile)"), "{text}");
    // Only the IOMMU mode changed: the difference is attributable, no warning.
    let mut fields = b.fields.clone();
    fields.iter_mut().filter(|f| f.key == "host.power_profile").for_each(|f| f.value = "performance".into());
    new.fingerprint = civetta::envinfo::Fingerprint::from_fields(fields).to_json();
    let text = civetta::bench::compare::compare(&base, &new).text;
    assert!(!text.contains("confounded") && text.contains("iommu mode: passthrough vs off"), "{text}");
}
