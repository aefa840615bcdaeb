//! The CI spill gate: every kernel instantiation that spills or touches scratch memory
//! fails the build unless an allow-list entry (with a reason) names it.

use super::report::{BuildReport, ReportRow};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;

/// `kernels/spill-allowlist.toml`: a list of `[[allow]]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allowlist {
    #[serde(default)]
    pub allow: Vec<AllowEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowEntry {
    /// Kernel symbol name.
    pub kernel: String,
    /// Code object stem (`gemm_w8a8.sb`); any when absent.
    pub object: Option<String>,
    /// Prefix of the compiler tag (`clang-19` matches `clang-19.1.7`); any when absent.
    pub compiler: Option<String>,
    pub arch: Option<String>,
    pub reason: String,
}

impl AllowEntry {
    fn matches(&self, compiler: &str, row: &ReportRow) -> bool {
        self.kernel == row.kernel.name
            && optional_match(&self.object, |o| o == row.object)
            && optional_match(&self.compiler, |c| compiler.starts_with(c))
            && optional_match(&self.arch, |a| a == row.kernel.arch)
    }
}

/// An absent filter matches everything.
fn optional_match(filter: &Option<String>, matches: impl Fn(&str) -> bool) -> bool {
    match filter {
        None => true,
        Some(value) => matches(value),
    }
}

impl Allowlist {
    pub fn parse(text: &str) -> Result<Allowlist> {
        let list: Allowlist = toml::from_str(text).context("parsing the spill allow-list")?;
        for entry in &list.allow {
            if entry.reason.trim().is_empty() {
                bail!("allow-list entry for {} has an empty reason", entry.kernel);
            }
        }
        Ok(list)
    }

    pub fn load(path: &Path) -> Result<Allowlist> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Allowlist::parse(&text).with_context(|| format!("in {}", path.display()))
    }
}

/// A kernel instantiation that uses scratch, and the allow-list reason if it is allowed.
#[derive(Debug)]
pub struct Finding<'a> {
    pub row: &'a ReportRow,
    pub allowed_because: Option<&'a str>,
}

impl Finding<'_> {
    pub fn describe(&self, compiler: &str) -> String {
        let k = &self.row.kernel;
        let instructions = k.scratch_instructions.map_or_else(|| "unknown".into(), |n| n.to_string());
        format!(
            "{compiler}/{}/{}: {} — VGPR spills {}, SGPR spills {}, scratch {} B/lane, scratch instructions {instructions}",
            k.arch, self.row.object, k.name, k.vgpr_spills, k.sgpr_spills, k.scratch_bytes
        )
    }
}

/// Every kernel of `report` that uses scratch, each with its allow-list reason if any.
pub fn check<'a>(report: &'a BuildReport, allowlist: &'a Allowlist) -> Vec<Finding<'a>> {
    report
        .kernels
        .iter()
        .filter(|row| row.kernel.uses_scratch())
        .map(|row| Finding {
            row,
            allowed_because: allowlist.allow.iter().find(|e| e.matches(&report.compiler, row)).map(|e| e.reason.as_str()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_need_a_reason() {
        assert!(Allowlist::parse("[[allow]]\nkernel = \"k\"\nreason = \"  \"\n").is_err());
        assert!(Allowlist::parse("[[allow]]\nkernel = \"k\"\n").is_err());
        assert!(Allowlist::parse("[[allow]]\nkernel = \"k\"\nreason = \"r\"\ntypo = 1\n").is_err());
        assert_eq!(Allowlist::parse("").unwrap().allow.len(), 0);
    }
}
