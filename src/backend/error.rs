//! The one error type of every [`Backend`](super::Backend) method: what went wrong, in a
//! variant a caller can match on (out of memory with the size asked for, an op or type the
//! backend has no kernel for, a driver call that failed with its name and code, arguments
//! outside a tensor). The model converts it into `anyhow::Error` at its boundary.

/// An error of a backend op, allocation or weight load.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device allocation of `bytes` failed.
    #[error("{backend} backend: out of device memory ({bytes} bytes asked for)")]
    OutOfMemory { backend: &'static str, bytes: usize },
    /// A driver or runtime call failed: its API name (`cuMemAlloc_v2`, `hipMemcpyAsync`), the
    /// status code it returned and the runtime's text for it.
    #[error("{backend} backend: {call} failed with code {code} ({message})")]
    Device { backend: &'static str, call: String, code: i64, message: String },
    /// An op, weight type or shape this backend has no kernel for.
    #[error("{backend} backend: {what} is not supported")]
    Unsupported { backend: &'static str, what: String },
    /// Arguments that do not fit the op or its tensors (a token outside the vocabulary, rows
    /// outside a weight, a count that does not match the heads).
    #[error("{backend} backend: {message}")]
    Invalid { backend: &'static str, message: String },
    /// A tensor of the model file is missing or cannot be read or prepared.
    #[error("tensor \"{name}\": {message}")]
    Tensor { name: String, message: String },
    /// `source`, while doing `what` (the tensor being uploaded, the table being written).
    #[error("{what}: {source}")]
    While { what: String, source: Box<Error> },
}

/// The result of every fallible backend method.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn unsupported(backend: &'static str, what: impl Into<String>) -> Error {
        Error::Unsupported { backend, what: what.into() }
    }

    pub fn invalid(backend: &'static str, message: impl Into<String>) -> Error {
        Error::Invalid { backend, message: message.into() }
    }

    /// This error, said to have happened while doing `what`.
    pub fn context(self, what: impl Into<String>) -> Error {
        Error::While { what: what.into(), source: Box::new(self) }
    }

    /// The error under every `While` layer.
    pub fn root(&self) -> &Error {
        match self {
            Error::While { source, .. } => source.root(),
            e => e,
        }
    }
}

/// `Error::context` on results.
pub trait ResultExt<T> {
    fn while_doing(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn while_doing(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.context(what()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_and_where() {
        let e =
            Error::Device { backend: "cuda", call: "cuMemcpyDtoHAsync_v2".into(), code: 700, message: "an illegal memory access".into() };
        assert_eq!(e.to_string(), "cuda backend: cuMemcpyDtoHAsync_v2 failed with code 700 (an illegal memory access)");
        let e = Error::OutOfMemory { backend: "hip", bytes: 1 << 30 }.context("uploading tensor \"blk.0.attn_q.weight\"");
        assert_eq!(
            e.to_string(),
            "uploading tensor \"blk.0.attn_q.weight\": hip backend: out of device memory (1073741824 bytes asked for)"
        );
        assert!(matches!(e.root(), Error::OutOfMemory { bytes: 1073741824, .. }));
    }
}
