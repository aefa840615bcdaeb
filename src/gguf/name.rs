//! The name a model is served under when the config does not set `model.name`.
//!
//! `general.name` is usually the product ("Qwen3 8B", "Gemma 3 270m"), but converters build it
//! from `general.basename` + size + `general.finetune`, and when the finetune is a training-run
//! tag the result is a string nobody types ("Smollm2 135M 8k Lc100K Mix1 Ep2"). Then the file's
//! own name is what users know the model by (llama.cpp's server reports it too).

use super::GgufFile;
use std::path::Path;

/// `general.name`, unless it is missing or a training-run string; else the model file's stem
/// (symbolic links such as models/default.gguf resolved to the file they point at).
pub fn served_model_name(file: &GgufFile) -> String {
    match file.get_str("general.name") {
        Some(name) if !name.trim().is_empty() && !is_training_run_name(name, file.get_str("general.finetune")) => name.to_string(),
        _ => file_stem(&file.path),
    }
}

/// A finetune tag with a digit in it ("8k-lc100k-mix1-ep2") names a training run, not a product
/// variant ("Instruct", "it", "Coder"); a `general.name` that carries it is such a string.
fn is_training_run_name(name: &str, finetune: Option<&str>) -> bool {
    let Some(tag) = finetune else { return false };
    if !tag.chars().any(|c| c.is_ascii_digit()) {
        return false;
    }
    let squash = |s: &str| s.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect::<String>();
    squash(name).contains(&squash(tag))
}

fn file_stem(path: &Path) -> String {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    real.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_run_tags_are_recognised() {
        assert!(is_training_run_name("Smollm2 135M 8k Lc100K Mix1 Ep2", Some("8k-lc100k-mix1-ep2")));
        assert!(!is_training_run_name("SmolLM2 135M Instruct", Some("Instruct")));
        assert!(!is_training_run_name("Gemma 3 270m", None));
        assert!(!is_training_run_name("Model v2", Some("ep3")), "a tag the name does not carry");
    }

    #[test]
    fn file_stem_follows_links() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("smollm2-135m-instruct-q4_1.gguf");
        std::fs::write(&real, b"").unwrap();
        let link = dir.path().join("default.gguf");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(file_stem(&link), "smollm2-135m-instruct-q4_1");
    }
}
