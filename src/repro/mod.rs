//! `civetta repro`: one command that reproduces a benchmark across layers (host, podman,
//! toolbox) and joins the reports of different boots (IOMMU modes) into one table.
//!
//! - [`layer`]: the [`layer::LayerRunner`] contract and the bench arguments every layer shares;
//! - [`layers`]: the real host, podman and toolbox layers (command construction + execution);
//! - [`driver`]: the interleaving over rounds, skipped/failed cells, the overhead rows;
//! - [`report`]: the JSON report (cells keyed by layer, each with its own fingerprint);
//! - [`merge`]: `repro merge`, columns labelled by the factors that differ;
//! - [`plan`]: `repro plan`, the kernel command line and steps per IOMMU mode;
//! - [`cli`]: the command lines.
//!
//! Which fingerprint fields are factors that can move a result: [`crate::envinfo::factors`].

pub mod cli;
pub mod driver;
pub mod layer;
pub mod layers;
pub mod merge;
pub mod plan;
pub mod report;
