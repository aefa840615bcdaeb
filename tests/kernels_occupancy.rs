//! Our waves/SIMD against clang's `Occupancy [waves/SIMD]` remark for every kernel in
//! kernels/ (and the sched_barrier variants), built with clang-19 and clang-22 for an
//! arch with the 1.5x register file (gfx1151) and one without (gfx1102).

mod kernels_support;

use civetta::kernels::{read_code_object_file, waves_per_simd};
use kernels_support::*;
use std::path::PathBuf;

fn kernel_sources() -> Vec<PathBuf> {
    let mut sources: Vec<PathBuf> = std::fs::read_dir(kernels_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hip"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 8, "expected the kernel sources in kernels/, found {sources:?}");
    sources
}

#[test]
fn occupancy_matches_clang_remarks_for_every_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let mut jobs = Vec::new();
    for clang in available_clangs() {
        for arch in ["gfx1151", "gfx1102"] {
            for source in kernel_sources() {
                let stem = source.file_stem().unwrap().to_string_lossy().into_owned();
                let sched_barrier = stem.starts_with("gemm_");
                jobs.push((clang, arch, source.clone(), stem.clone(), false));
                if sched_barrier {
                    jobs.push((clang, arch, source, format!("{stem}.sb"), true));
                }
            }
        }
    }
    // Two workers: the CI machine has two cores.
    let jobs = std::sync::Mutex::new(jobs);
    let checked = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some((clang, arch, source, stem, sb)) = jobs.lock().unwrap().pop() else { break };
                let out = dir.path().join(clang).join(arch);
                let defines: &[&str] = if sb { &["CIVETTA_SCHED_BARRIER=1"] } else { &[] };
                let compiled = compile(clang, arch, &source, &out, &stem, defines);
                let kernels = read_code_object_file(&compiled.hsaco).unwrap();
                let remarks = parse_remarks(&compiled.remarks);
                assert_eq!(remarks.len(), kernels.len(), "{clang} {arch} {stem}: remarks vs metadata kernels");
                for (name, fields) in remarks {
                    let k = kernels.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("{name} not in metadata"));
                    let clang_waves = remark_u32(&fields, "Occupancy [waves/SIMD]")
                        .unwrap_or_else(|| panic!("{clang} {arch} {name}: no numeric occupancy remark: {fields:?}"));
                    let ours = waves_per_simd(arch, k, k.max_flat_workgroup_size).unwrap();
                    assert_eq!(
                        ours.waves_per_simd, clang_waves,
                        "{clang} {arch} {stem}/{name}: ours {ours:?} vs clang {clang_waves}; kernel {k:?}"
                    );
                    checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let checked = checked.into_inner();
    eprintln!("checked occupancy of {checked} kernel builds against clang");
    if !available_clangs().is_empty() {
        assert!(checked >= 40, "only {checked} kernels checked");
    }
}
