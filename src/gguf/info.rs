//! `civetta info`: a GGUF file's header, metadata and tensor table.

use super::reader::{GgufFile, MetadataValue};
use std::collections::BTreeMap;
use std::fmt::Write;

fn short_value(v: &MetadataValue) -> String {
    match v {
        MetadataValue::String(s) => {
            let one_line = s.replace('\n', "\\n");
            if one_line.chars().count() > 80 {
                format!("{:?}… ({} bytes)", one_line.chars().take(80).collect::<String>(), s.len())
            } else {
                format!("{one_line:?}")
            }
        }
        MetadataValue::Array(a) => {
            let elem = a.first().map(|x| x.type_name()).unwrap_or("?");
            let head: Vec<String> = a.iter().take(4).map(short_value).collect();
            format!("[{elem}; {}] [{}{}]", a.len(), head.join(", "), if a.len() > 4 { ", …" } else { "" })
        }
        MetadataValue::F32(x) => format!("{x}"),
        MetadataValue::F64(x) => format!("{x}"),
        MetadataValue::Bool(b) => format!("{b}"),
        other => other.as_i64().map(|x| x.to_string()).unwrap_or_else(|| format!("{other:?}")),
    }
}

pub fn render_info(f: &GgufFile, _show_all_metadata: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{}: GGUF v{}, {} bytes, alignment {}, {} metadata keys, {} tensors",
        f.path.display(),
        f.version,
        f.file_bytes(),
        f.alignment,
        f.metadata.len(),
        f.tensors.len()
    );
    s += "\nmetadata:\n";
    for (k, v) in &f.metadata {
        let _ = writeln!(s, "  {k:<45} {:<7} {}", v.type_name(), short_value(v));
    }
    s += "\ntensors:\n";
    let _ = writeln!(s, "  {:<36} {:<6} {:<22} {:>12} {:>12}", "name", "type", "dims", "bytes", "offset");
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let mut params = 0u64;
    for t in &f.tensors {
        let _ = writeln!(s, "  {:<36} {:<6} {:<22} {:>12} {:>12}", t.name, t.ggml_type.name(), format!("{:?}", t.dims), t.size_bytes, t.offset);
        *counts.entry(t.ggml_type.name()).or_default() += 1;
        params += t.n_elements();
    }
    let mix: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let _ = writeln!(s, "\ntensor types: {}; parameters: {params}", mix.join(", "));
    s
}

pub fn info_json(f: &GgufFile) -> serde_json::Value {
    let meta: serde_json::Map<String, serde_json::Value> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::json!({ "type": v.type_name(), "value": short_value(v) })))
        .collect();
    let tensors: Vec<serde_json::Value> = f
        .tensors
        .iter()
        .map(|t| serde_json::json!({ "name": t.name, "type": t.ggml_type.name(), "dims": t.dims, "bytes": t.size_bytes, "offset": t.offset }))
        .collect();
    serde_json::json!({
        "path": f.path.display().to_string(), "version": f.version, "file_bytes": f.file_bytes(),
        "alignment": f.alignment, "metadata": meta, "tensors": tensors,
    })
}
