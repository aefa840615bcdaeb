//! Optional bearer-token authentication of the Inference service. Health checks and
//! reflection are separate services and stay open (probes and grpcurl need no secret;
//! reflection only describes the public API).

use crate::config::ServerConfig;
use anyhow::Context;
use std::sync::Arc;
use tonic::{Request, Status};

/// The expected token; `None` means authentication is off.
#[derive(Clone, Default)]
pub struct Token(Option<Arc<[u8]>>);

impl Token {
    pub fn new(token: &str) -> Token {
        Token(Some(Arc::from(token.as_bytes())))
    }

    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Reads the token named by the config (file or environment variable).
    pub fn from_config(cfg: &ServerConfig) -> anyhow::Result<Token> {
        let (token, origin) = if let Some(p) = &cfg.auth_token_file {
            let t = std::fs::read_to_string(p).with_context(|| format!("reading the auth token file {}", p.display()))?;
            (t, format!("the auth token file {}", p.display()))
        } else if let Some(var) = &cfg.auth_token_env {
            let t = std::env::var(var).with_context(|| format!("server.auth_token_env names {var}, which is not set"))?;
            (t, format!("the auth token variable {var}"))
        } else {
            return Ok(Token(None));
        };
        let token = token.trim();
        anyhow::ensure!(!token.is_empty(), "{origin} is empty");
        anyhow::ensure!(token.chars().all(|c| c.is_ascii_graphic()), "{origin} holds characters other than printable ASCII");
        Ok(Token::new(token))
    }

    /// Whether `authorization` metadata (`Bearer <token>`) carries the expected token. The
    /// scheme name is case-insensitive (RFC 7235 section 2.1, RFC 6750 section 2.1).
    pub fn accepts(&self, authorization: Option<&str>) -> bool {
        let Some(expected) = &self.0 else { return true };
        let given = authorization.and_then(bearer_credentials).unwrap_or("");
        constant_time_eq(given.as_bytes(), expected)
    }
}

/// The credentials of a `Bearer` authorization value (any case of the scheme name, one or
/// more spaces before the token).
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim_start_matches(' '))
}

/// A tonic interceptor that refuses calls without the expected token with UNAUTHENTICATED.
pub fn interceptor(token: Token) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let header = req.metadata().get("authorization").and_then(|v| v.to_str().ok());
        if token.accepts(header) {
            Ok(req)
        } else {
            Err(Status::unauthenticated("missing or wrong bearer token (send `authorization: Bearer <token>`)"))
        }
    }
}

/// Compares without stopping at the first differing byte, so the time taken does not
/// reveal how much of a guess was right. (The length is not secret.)
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_the_exact_bearer_token() {
        let t = Token::new("s3cret");
        assert!(t.accepts(Some("Bearer s3cret")));
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert!(t.accepts(Some(&format!("{scheme} s3cret"))), "{scheme}");
        }
        assert!(t.accepts(Some("Bearer  s3cret")), "more than one space before the token");
        for bad in [
            None,
            Some(""),
            Some("s3cret"),
            Some("Bearer s3cre"),
            Some("Bearer s3cret "),
            Some("Bearer S3cret"),
            Some("Basic s3cret"),
            Some("Bearers3cret"),
            Some("Bearer\ts3cret"),
        ] {
            assert!(!t.accepts(bad), "{bad:?}");
        }
        assert!(Token::default().accepts(None), "no token configured: everything passes");
    }

    #[test]
    fn interceptor_answers_unauthenticated() {
        let mut i = interceptor(Token::new("abc"));
        let mut ok = Request::new(());
        ok.metadata_mut().insert("authorization", "Bearer abc".parse().unwrap());
        assert!(i(ok).is_ok());
        assert_eq!(i(Request::new(())).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn token_from_file_or_env() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("token");
        std::fs::write(&p, "abc123\n").unwrap();
        let mut cfg = crate::config::Config::default().server;
        cfg.auth_token_file = Some(p.clone());
        assert!(Token::from_config(&cfg).unwrap().accepts(Some("Bearer abc123")));
        std::fs::write(&p, "  \n").unwrap();
        assert!(format!("{:#}", Token::from_config(&cfg).err().unwrap()).contains("is empty"));
        cfg.auth_token_file = Some(dir.path().join("missing"));
        assert!(format!("{:#}", Token::from_config(&cfg).err().unwrap()).contains("missing"));
        cfg.auth_token_file = None;
        cfg.auth_token_env = Some("CIVETTA_TEST_SURELY_UNSET_TOKEN_VAR".into());
        assert!(format!("{:#}", Token::from_config(&cfg).err().unwrap()).contains("not set"));
        cfg.auth_token_env = None;
        assert!(!Token::from_config(&cfg).unwrap().is_enabled());
    }
}
