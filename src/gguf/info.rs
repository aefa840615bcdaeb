//! `civetta info`: a GGUF file's header, metadata and tensor table, as text or JSON.

use super::reader::{GgufFile, MetadataValue};
use super::GgmlType;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Array items and string characters shown before abbreviating (unless showing everything).
const ARRAY_HEAD: usize = 4;
const STRING_HEAD: usize = 80;
/// Array items listed in JSON output.
const JSON_ARRAY_HEAD: usize = 8;

fn element_type(items: &[MetadataValue]) -> &'static str {
    items.first().map_or("?", |x| x.type_name())
}

/// One metadata value on one line; `full` disables abbreviation of long strings and arrays.
fn render_value(v: &MetadataValue, full: bool) -> String {
    match v {
        MetadataValue::String(s) => {
            let one_line = s.replace('\n', "\\n");
            if !full && one_line.chars().count() > STRING_HEAD {
                let head: String = one_line.chars().take(STRING_HEAD).collect();
                format!("{head:?}… ({} bytes)", s.len())
            } else {
                format!("{one_line:?}")
            }
        }
        MetadataValue::Array(a) => {
            let shown = if full { a.len() } else { a.len().min(ARRAY_HEAD) };
            let head: Vec<String> = a[..shown].iter().map(|x| render_value(x, full)).collect();
            let more = if shown < a.len() { ", …" } else { "" };
            format!("[{}; {}] [{}{more}]", element_type(a), a.len(), head.join(", "))
        }
        MetadataValue::F32(x) => format!("{x}"),
        MetadataValue::F64(x) => format!("{x}"),
        MetadataValue::Bool(b) => format!("{b}"),
        MetadataValue::U64(x) => format!("{x}"),
        other => other.as_i64().map_or_else(|| format!("{other:?}"), |x| x.to_string()),
    }
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

fn dims_text(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

/// Per-type tensor count, bytes and element count.
fn type_summary(f: &GgufFile) -> BTreeMap<GgmlType, (usize, u64, u64)> {
    let mut by_type: BTreeMap<GgmlType, (usize, u64, u64)> = BTreeMap::new();
    for t in &f.tensors {
        let e = by_type.entry(t.ggml_type).or_default();
        e.0 += 1;
        e.1 = e.1.saturating_add(t.size_bytes);
        e.2 = e.2.saturating_add(t.n_elements());
    }
    by_type
}

/// `{arch}.expert_count` and `{arch}.expert_used_count` of a mixture-of-experts model.
fn expert_counts(f: &GgufFile) -> Option<(u64, u64)> {
    let arch = f.architecture()?;
    Some((f.get_u64(&format!("{arch}.expert_count"))?, f.get_u64(&format!("{arch}.expert_used_count")).unwrap_or(0)))
}

/// Human-readable report. Long strings and arrays are abbreviated unless `show_all_metadata`.
pub fn render_info(f: &GgufFile, show_all_metadata: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "file:        {}", f.path.display());
    let _ = writeln!(s, "format:      GGUF v{}, alignment {}", f.version, f.alignment);
    let _ = writeln!(s, "size:        {} ({} bytes)", human_bytes(f.file_bytes()), f.file_bytes());
    let _ = writeln!(s, "data offset: {}", f.data_offset);
    if let Some(arch) = f.architecture() {
        let _ = writeln!(s, "arch:        {arch}");
    }
    if let Some((n, used)) = expert_counts(f) {
        let _ = writeln!(s, "experts:     {n} ({used} used per token)");
    }
    let _ = writeln!(s, "tensors:     {}", f.tensors.len());

    let _ = writeln!(s, "\nmetadata ({} keys):", f.metadata.len());
    let key_w = f.metadata.keys().map(|k| k.len()).max().unwrap_or(0).clamp(10, 48);
    for (k, v) in &f.metadata {
        let _ = writeln!(s, "  {k:<key_w$} {:<7} {}", v.type_name(), render_value(v, show_all_metadata));
    }

    let _ = writeln!(s, "\ntensors ({}):", f.tensors.len());
    let name_w = f.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0).clamp(4, 48);
    let _ = writeln!(s, "  {:<name_w$} {:<5} {:<24} {:>12} {:>12}", "name", "type", "dims", "bytes", "offset");
    for t in &f.tensors {
        let _ =
            writeln!(s, "  {:<name_w$} {:<5} {:<24} {:>12} {:>12}", t.name, t.ggml_type.name(), dims_text(&t.dims), t.size_bytes, t.offset);
    }

    let summary = type_summary(f);
    let _ = writeln!(s, "\ntensor types:");
    let (mut total_bytes, mut total_params) = (0u64, 0u64);
    for (ty, (count, bytes, params)) in &summary {
        let _ = writeln!(s, "  {:<5} {count:>5} tensors {:>12} {params:>14} parameters", ty.name(), human_bytes(*bytes));
        total_bytes = total_bytes.saturating_add(*bytes);
        total_params = total_params.saturating_add(*params);
    }
    let _ = writeln!(s, "total: {} tensors, {total_params} parameters, {} of tensor data", f.tensors.len(), human_bytes(total_bytes));
    s
}

/// Metadata value as JSON: scalars as themselves, arrays as type, length and first items.
fn value_json(v: &MetadataValue) -> Value {
    use MetadataValue as V;
    match v {
        V::String(s) => json!(s),
        V::Bool(b) => json!(b),
        V::F32(x) => json!(x),
        V::F64(x) => json!(x),
        V::U64(x) => json!(x),
        V::Array(a) => json!({
            "element_type": element_type(a),
            "len": a.len(),
            "head": a.iter().take(JSON_ARRAY_HEAD).map(value_json).collect::<Vec<_>>(),
        }),
        other => json!(other.as_i64()),
    }
}

/// Machine-readable report (`civetta info --json`).
pub fn info_json(f: &GgufFile) -> Value {
    let metadata: serde_json::Map<String, Value> =
        f.metadata.iter().map(|(k, v)| (k.clone(), json!({ "type": v.type_name(), "value": value_json(v) }))).collect();
    let tensors: Vec<Value> = f
        .tensors
        .iter()
        .map(|t| json!({ "name": t.name, "type": t.ggml_type.name(), "dims": t.dims, "bytes": t.size_bytes, "offset": t.offset }))
        .collect();
    let summary: serde_json::Map<String, Value> = type_summary(f)
        .into_iter()
        .map(|(ty, (count, bytes, params))| (ty.name().to_string(), json!({ "tensors": count, "bytes": bytes, "parameters": params })))
        .collect();
    let total_params = f.tensors.iter().fold(0u64, |acc, t| acc.saturating_add(t.n_elements()));
    json!({
        "path": f.path.display().to_string(),
        "version": f.version,
        "file_bytes": f.file_bytes(),
        "alignment": f.alignment,
        "data_offset": f.data_offset,
        "architecture": f.architecture(),
        "expert_count": expert_counts(f).map(|e| e.0),
        "expert_used_count": expert_counts(f).map(|e| e.1),
        "metadata": metadata,
        "tensors": tensors,
        "tensor_types": summary,
        "total_parameters": total_params,
    })
}
