//! Which kernels may start while the kernel before them finishes (issue #17).
//!
//! A kernel that calls `cv_wait_prior_kernels()` (kernels/civetta_gpu.h) waits for the stream's
//! previous kernel itself, so the CUDA backend may launch it with programmatic stream
//! serialization (`GpuApi::launch`'s `overlap_previous`): its workgroups start, and its weight
//! loads run, during that kernel's tail instead of after it. Launching a kernel that does not
//! wait that way would let it read unfinished results, so the choice is made from the compiled
//! code itself: an entry of a PTX image qualifies when its body holds `griddepcontrol.wait`
//! (emitted only for sm_90+ targets). AMD code objects never qualify: HIP has no such launch.

/// Whether the PTX entry `name` (the full symbol, `civetta_…`) waits for the prior kernel.
pub fn ptx_entry_waits_for_prior_kernels(ptx: &str, name: &str) -> bool {
    entry_body(ptx, name).is_some_and(|body| body.contains("griddepcontrol.wait"))
}

/// The text of `.entry name(` up to the next `.entry` (or the end of the image).
fn entry_body<'a>(ptx: &'a str, name: &str) -> Option<&'a str> {
    let header = format!(".entry {name}(");
    let start = ptx.find(&header)? + header.len();
    let rest = &ptx[start..];
    Some(&rest[..rest.find(".entry ").unwrap_or(rest.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "
.visible .entry civetta_a(
\t.param .u64 civetta_a_param_0
)
{
\tld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];
\tgriddepcontrol.wait;
\tgriddepcontrol.launch_dependents;
\tret;
}
.visible .entry civetta_ab(
\t.param .u64 civetta_ab_param_0
)
{
\tret;
}
";

    #[test]
    fn an_entry_qualifies_only_by_its_own_body() {
        assert!(ptx_entry_waits_for_prior_kernels(PTX, "civetta_a"));
        // civetta_ab follows civetta_a and shares its prefix, but does not wait.
        assert!(!ptx_entry_waits_for_prior_kernels(PTX, "civetta_ab"));
        assert!(!ptx_entry_waits_for_prior_kernels(PTX, "civetta_missing"));
    }

    #[test]
    fn the_last_entry_reaches_the_end_of_the_image() {
        let ptx = format!("{PTX}.visible .entry civetta_c(\n)\n{{\n\tgriddepcontrol.wait;\n}}\n");
        assert!(ptx_entry_waits_for_prior_kernels(&ptx, "civetta_c"));
    }
}
