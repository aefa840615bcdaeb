//! Kernel resources read from AMDGPU code objects (the `.hsaco` ELF files clang writes).
//!
//! The compiler records per-kernel register and memory usage in the ELF note
//! `NT_AMDGPU_METADATA` (owner "AMDGPU", type 32) as a MessagePack map
//! (code object v3+; the format is in LLVM's AMDGPUUsage document). The number of
//! `scratch_` instructions is not in the metadata; it comes from the ISA (`.s`) beside it.

use anyhow::{anyhow, bail, Context, Result};
use object::read::elf::{FileHeader, SectionHeader};
use rmpv::Value;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

const EM_AMDGPU: u16 = 224;
const NT_AMDGPU_METADATA: u32 = 32;

/// Static resources of one kernel in one code object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelResources {
    /// Kernel name (`.name`), the symbol passed to `hipModuleGetFunction`.
    pub name: String,
    /// Processor, e.g. `gfx1151`, from `amdhsa.target`.
    pub arch: String,
    pub vgprs: u32,
    pub sgprs: u32,
    pub vgpr_spills: u32,
    pub sgpr_spills: u32,
    /// Private (scratch) memory per work-item in bytes (`.private_segment_fixed_size`).
    pub scratch_bytes: u32,
    /// Static LDS per workgroup in bytes (`.group_segment_fixed_size`).
    pub lds_bytes: u32,
    pub wavefront_size: u32,
    pub max_flat_workgroup_size: u32,
    /// `scratch_*` instructions in the kernel's ISA, when the ISA was available.
    pub scratch_instructions: Option<u32>,
}

impl KernelResources {
    /// True when the kernel touches scratch memory in any way: spills, a private
    /// segment, or scratch instructions.
    pub fn uses_scratch(&self) -> bool {
        self.vgpr_spills > 0 || self.sgpr_spills > 0 || self.scratch_bytes > 0 || self.scratch_instructions.unwrap_or(0) > 0
    }
}

/// Every kernel described by a code object's metadata note.
pub fn read_code_object(bytes: &[u8]) -> Result<Vec<KernelResources>> {
    let desc = metadata_note(bytes)?;
    decode_metadata(desc)
}

/// Reads a `.hsaco` file and, when `<stem>.s` lies beside it, counts each kernel's
/// `scratch_` instructions in that ISA.
pub fn read_code_object_file(path: &Path) -> Result<Vec<KernelResources>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut kernels = read_code_object(&bytes).with_context(|| format!("in {}", path.display()))?;
    let asm_path = path.with_extension("s");
    if let Ok(asm) = std::fs::read_to_string(&asm_path) {
        let counts = count_scratch_instructions(&asm);
        for k in &mut kernels {
            k.scratch_instructions = Some(counts.get(&k.name).copied().unwrap_or(0));
        }
    }
    Ok(kernels)
}

/// The processor name of an `amdhsa.target` string:
/// `amdgcn-amd-amdhsa--gfx1151:xnack-` -> `gfx1151`.
pub fn arch_from_target(target: &str) -> String {
    // arch-vendor-os-environment-processor[:feature±...]; feature flags end in '-' too.
    let processor = target.splitn(5, '-').nth(4).unwrap_or(target);
    processor.split(':').next().unwrap_or(processor).to_string()
}

/// `scratch_*` instructions per function in AMDGPU assembly, counting from a
/// function's label to its `.Lfunc_end` marker.
pub fn count_scratch_instructions(asm: &str) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in asm.lines() {
        // ';' starts a comment; labels carry one like `name:   ; @name`.
        let code = line.split(';').next().unwrap_or("");
        let trimmed = code.trim();
        if let Some(label) = trimmed.strip_suffix(':') {
            if label.starts_with(".Lfunc_end") {
                current = None;
            } else if !label.starts_with('.') && !label.contains(char::is_whitespace) && !code.starts_with(char::is_whitespace) {
                counts.entry(label.to_string()).or_insert(0);
                current = Some(label.to_string());
            }
            continue;
        }
        if let Some(name) = &current {
            if trimmed.starts_with("scratch_") {
                *counts.get_mut(name).expect("entry inserted at the label") += 1;
            }
        }
    }
    counts
}

fn metadata_note(bytes: &[u8]) -> Result<&[u8]> {
    let header = object::elf::FileHeader64::<object::Endianness>::parse(bytes).map_err(|e| anyhow!("not a 64-bit ELF file: {e}"))?;
    let endian = header.endian().map_err(|e| anyhow!("bad ELF header: {e}"))?;
    let machine = header.e_machine(endian);
    if machine != EM_AMDGPU {
        bail!("not an AMDGPU code object (ELF machine {machine}, expected {EM_AMDGPU})");
    }
    let sections = header.sections(endian, bytes).map_err(|e| anyhow!("bad ELF section table: {e}"))?;
    for section in sections.iter() {
        let Some(mut notes) = section.notes(endian, bytes).map_err(|e| anyhow!("bad ELF note section: {e}"))? else {
            continue;
        };
        while let Some(note) = notes.next().map_err(|e| anyhow!("bad ELF note: {e}"))? {
            if note.name() == b"AMDGPU" && note.n_type(endian) == NT_AMDGPU_METADATA {
                return Ok(note.desc());
            }
        }
    }
    bail!("no NT_AMDGPU_METADATA note (code object v2 or not built for amdhsa?)")
}

fn decode_metadata(mut desc: &[u8]) -> Result<Vec<KernelResources>> {
    let root = rmpv::decode::read_value(&mut desc).context("decoding the metadata msgpack")?;
    let target = lookup(&root, "amdhsa.target").and_then(Value::as_str).ok_or_else(|| anyhow!("metadata has no amdhsa.target"))?;
    let arch = arch_from_target(target);
    let kernels =
        lookup(&root, "amdhsa.kernels").and_then(Value::as_array).ok_or_else(|| anyhow!("metadata has no amdhsa.kernels array"))?;
    kernels
        .iter()
        .map(|k| {
            let name = lookup(k, ".name").and_then(Value::as_str).ok_or_else(|| anyhow!("kernel without .name"))?;
            let field = |key: &str| -> Result<u32> {
                let value = lookup(k, key).ok_or_else(|| anyhow!("kernel {name}: missing {key}"))?;
                let n = value.as_u64().ok_or_else(|| anyhow!("kernel {name}: {key} is not an unsigned integer"))?;
                u32::try_from(n).map_err(|_| anyhow!("kernel {name}: {key} = {n} out of range"))
            };
            Ok(KernelResources {
                name: name.to_string(),
                arch: arch.clone(),
                vgprs: field(".vgpr_count")?,
                sgprs: field(".sgpr_count")?,
                vgpr_spills: field(".vgpr_spill_count")?,
                sgpr_spills: field(".sgpr_spill_count")?,
                scratch_bytes: field(".private_segment_fixed_size")?,
                lds_bytes: field(".group_segment_fixed_size")?,
                wavefront_size: field(".wavefront_size")?,
                max_flat_workgroup_size: field(".max_flat_workgroup_size")?,
                scratch_instructions: None,
            })
        })
        .collect()
}

fn lookup<'a>(map: &'a Value, key: &str) -> Option<&'a Value> {
    map.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_is_the_processor_of_the_target_triple() {
        assert_eq!(arch_from_target("amdgcn-amd-amdhsa--gfx1151"), "gfx1151");
        assert_eq!(arch_from_target("amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(arch_from_target("amdgcn-amd-amdhsa--gfx90a:xnack-:sramecc+"), "gfx90a");
    }

    #[test]
    fn scratch_instructions_are_counted_per_function() {
        let asm = "\t.text\n\t.globl\tk1\nk1:                ; @k1\n\tv_mov_b32 v0, 0\n\tscratch_store_b32 off, v0, off\n.LBB0_1:\n\tscratch_load_b32 v1, off, off\n.Lfunc_end0:\n\tscratch_load_b32 v1, off, off\nk2:\n\ts_endpgm\n.Lfunc_end1:\n";
        let counts = count_scratch_instructions(asm);
        assert_eq!(counts.get("k1"), Some(&2));
        assert_eq!(counts.get("k2"), Some(&0));
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn non_elf_and_non_amdgpu_inputs_are_errors() {
        assert!(read_code_object(b"not an elf").is_err());
        let err = read_code_object(&std::fs::read(std::env::current_exe().unwrap()).unwrap()).unwrap_err();
        assert!(err.to_string().contains("not an AMDGPU code object"), "{err}");
    }

    #[test]
    fn metadata_fields_are_decoded() {
        let kernel = Value::Map(
            [
                (".name", Value::from("k")),
                (".symbol", Value::from("k.kd")),
                (".vgpr_count", Value::from(40)),
                (".sgpr_count", Value::from(18)),
                (".vgpr_spill_count", Value::from(3)),
                (".sgpr_spill_count", Value::from(0)),
                (".private_segment_fixed_size", Value::from(16)),
                (".group_segment_fixed_size", Value::from(4096)),
                (".wavefront_size", Value::from(32)),
                (".max_flat_workgroup_size", Value::from(256)),
            ]
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
        );
        let root = Value::Map(vec![
            (Value::from("amdhsa.target"), Value::from("amdgcn-amd-amdhsa--gfx1100")),
            (Value::from("amdhsa.kernels"), Value::Array(vec![kernel])),
        ]);
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &root).unwrap();
        let kernels = decode_metadata(&buf).unwrap();
        assert_eq!(kernels.len(), 1);
        let k = &kernels[0];
        assert_eq!((k.name.as_str(), k.arch.as_str()), ("k", "gfx1100"));
        assert_eq!((k.vgprs, k.sgprs, k.vgpr_spills, k.scratch_bytes, k.lds_bytes), (40, 18, 3, 16, 4096));
        assert!(k.uses_scratch());
    }
}
