//! The code object reader against kernels compiled during the test run with clang-19 and
//! clang-22: a kernel with a known static LDS size and one forced to spill registers.

mod kernels_support;

use civetta::kernels::{read_code_object, read_code_object_file, waves_per_simd};
use kernels_support::*;

const TEST_KERNELS: &str = r#"
#include "civetta_gpu.h"
// 3000 bytes of static LDS.
CV_KERNEL CV_LAUNCH_BOUNDS(64) void test_lds(float* out) {
  __shared__ float buf[750];
  for (int i = (int)cv_tid_x(); i < 750; i += 64) buf[i] = (float)i;
  cv_sync();
  out[cv_tid_x()] = buf[749 - cv_tid_x()];
}
// 48 live accumulators under a 24-VGPR cap: the register allocator must spill.
CV_KERNEL CV_LAUNCH_BOUNDS(64) __attribute__((amdgpu_num_vgpr(24))) void test_spill(float* out, const float* in, int n) {
  float acc[48];
  CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = in[i * 64 + cv_tid_x()];
  for (int r = 0; r < n; ++r) {
    CV_UNROLL for (int i = 0; i < 48; ++i) acc[i] = acc[i] * acc[(i + 7) % 48] + in[r * 48 + i];
  }
  CV_UNROLL for (int i = 0; i < 48; ++i) out[i * 64 + cv_tid_x()] = acc[i];
}
"#;

#[test]
fn reader_sees_lds_spills_and_scratch_from_both_compilers() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("test_kernels.hip");
    std::fs::write(&source, TEST_KERNELS).unwrap();
    for clang in available_clangs() {
        for arch in ["gfx1151", "gfx1100"] {
            let out = dir.path().join(clang).join(arch);
            let compiled = compile(clang, arch, &source, &out, "test_kernels", &[]);
            let kernels = read_code_object_file(&compiled.hsaco).unwrap();
            let names: Vec<&str> = kernels.iter().map(|k| k.name.as_str()).collect();
            assert_eq!(names.len(), 2, "{clang} {arch}: {names:?}");

            let lds = kernels.iter().find(|k| k.name == "test_lds").unwrap();
            assert_eq!(lds.arch, arch);
            assert_eq!(lds.lds_bytes, 3000, "{clang} {arch}");
            assert_eq!(lds.max_flat_workgroup_size, 64);
            assert_eq!(lds.wavefront_size, 32);
            assert!(!lds.uses_scratch(), "{clang} {arch}: {lds:?}");
            assert_eq!(lds.scratch_instructions, Some(0));

            let spill = kernels.iter().find(|k| k.name == "test_spill").unwrap();
            assert!(spill.vgprs <= 24, "{clang} {arch}: cap ignored: {spill:?}");
            assert!(spill.vgpr_spills > 0, "{clang} {arch}: {spill:?}");
            assert!(spill.scratch_bytes > 0, "{clang} {arch}: {spill:?}");
            assert!(spill.scratch_instructions.unwrap() > 0, "{clang} {arch}: {spill:?}");

            // The metadata agrees with clang's own remarks.
            for (name, fields) in parse_remarks(&compiled.remarks) {
                let k = kernels.iter().find(|k| k.name == name).unwrap();
                assert_eq!(remark_u32(&fields, "VGPRs"), Some(k.vgprs), "{clang} {arch} {name}");
                assert_eq!(remark_u32(&fields, "ScratchSize [bytes/lane]"), Some(k.scratch_bytes), "{clang} {arch} {name}");
                assert_eq!(remark_u32(&fields, "VGPRs Spill"), Some(k.vgpr_spills), "{clang} {arch} {name}");
                assert_eq!(remark_u32(&fields, "LDS Size [bytes/block]"), Some(k.lds_bytes), "{clang} {arch} {name}");
                assert!(waves_per_simd(arch, k, k.max_flat_workgroup_size).is_some());
            }
        }
    }
}

#[test]
fn truncated_code_object_is_an_error_not_a_panic() {
    let Some(clang) = available_clangs().into_iter().next() else { return };
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("t.hip");
    std::fs::write(&source, TEST_KERNELS).unwrap();
    let compiled = compile(clang, "gfx1151", &source, dir.path(), "t", &[]);
    let bytes = std::fs::read(&compiled.hsaco).unwrap();
    for len in [0, 16, 64, bytes.len() / 2, bytes.len() - 1] {
        // The section headers sit at the end of the file, so every prefix lacks them.
        assert!(read_code_object(&bytes[..len]).is_err(), "prefix of {len} bytes accepted");
    }
    assert_eq!(read_code_object(&bytes).unwrap().len(), 2);
}
