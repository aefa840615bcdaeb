//! placeholder
pub struct GgufWriter;
