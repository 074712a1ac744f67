//! Bearer tokens: sent as the metadata `authorization: Bearer <token>` on every call when the
//! cluster has access control on.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::error::{Error, Result};

/// The metadata key a token travels in.
pub use conch_proto::wire::AUTHORIZATION;

/// A token for a cluster with access control on. Its `Debug` output hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct BearerToken(MetadataValue<Ascii>);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(<hidden>)")
    }
}

impl BearerToken {
    /// A token as printed by `conch auth token create` (surrounding whitespace is ignored).
    ///
    /// ```
    /// use conch_client::BearerToken;
    ///
    /// assert!(BearerToken::new("conch_0123456789abcdef").is_ok());
    /// assert!(BearerToken::new("two words").is_err());
    /// assert!(BearerToken::new("").is_err());
    /// ```
    pub fn new(token: &str) -> Result<BearerToken> {
        let token = token.trim();
        let bad = |reason: &str| Error::InvalidToken {
            reason: reason.to_string(),
        };
        if token.is_empty() {
            return Err(bad("the token is empty"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(bad("a token is one word of printable ASCII characters"));
        }
        MetadataValue::try_from(format!("Bearer {token}"))
            .map(|mut value| {
                value.set_sensitive(true);
                BearerToken(value)
            })
            .map_err(|_| bad("a token is one word of printable ASCII characters"))
    }

    /// Reads a token from a file (its only content, surrounding whitespace ignored).
    pub fn from_file(path: &std::path::Path) -> Result<BearerToken> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::InvalidToken {
            reason: format!("read {}: {e}", path.display()),
        })?;
        BearerToken::new(&text)
    }
}

/// Adds the configured token (if any) to every request.
#[derive(Clone, Debug, Default)]
pub struct TokenInterceptor(Option<BearerToken>);

impl TokenInterceptor {
    /// An interceptor sending `token`, or nothing.
    pub fn new(token: Option<BearerToken>) -> Self {
        TokenInterceptor(token)
    }
}

impl Interceptor for TokenInterceptor {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(BearerToken(value)) = &self.0 {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        Ok(request)
    }
}

/// A channel to one node that sends the client's token on every call.
pub type NodeChannel = InterceptedService<Channel, TokenInterceptor>;
