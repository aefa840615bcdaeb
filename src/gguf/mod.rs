//! GGUF v2/v3 reader (over memmap2) and writer.
//!
//! OWNER: gguf helper. Interface is fixed; see docs/ARCHITECTURE.md.

mod types;
pub use types::GgmlType;

pub mod info;
pub mod reader;
pub mod writer;

pub use reader::{GgufError, GgufFile, MetadataValue, TensorInfo};
pub use writer::GgufWriter;

#[cfg(test)]
mod tests;
