//! GGUF v2/v3 reader (over memmap2) and writer.
//!
//! OWNER: gguf helper. Interface is fixed; see docs/ARCHITECTURE.md.

mod types;
pub use types::GgmlType;

pub mod info;
mod name;
pub mod reader;
pub mod writer;

pub use name::served_model_name;
pub use reader::{GgufError, GgufFile, MetadataValue, TensorInfo, WeightsMemory};
pub use writer::GgufWriter;

#[cfg(test)]
mod tests;
