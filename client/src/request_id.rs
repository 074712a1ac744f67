//! Request ids: one per logical write, sent as `conch-request-id` metadata with every attempt
//! of it. conchd remembers the reply of the first attempt that took effect and answers a retry
//! with it, so a write whose reply was lost (a dropped connection, a timeout) is not applied
//! twice: a retried create answers what the first create answered, a retried lease create
//! returns the same lease, a retried acquire the same grant and fencing token.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::Request;
use tonic::metadata::MetadataValue;

/// The request metadata key carrying a write's request id.
pub use conch_proto::wire::REQUEST_ID_HEADER as REQUEST_ID_METADATA_KEY;

/// A fresh request id: 128 bits in hex, from the process's randomly keyed hasher, the time
/// and a counter (unique, not secret).
pub fn new_request_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.write_u64(count);
        hasher.write_u128(nanos);
        hasher.write_u32(std::process::id());
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// Builds a request with a `grpc-timeout`.
pub fn request<T>(message: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(message);
    r.set_timeout(timeout);
    r
}

/// Builds a request with a `grpc-timeout` and the request id `id`.
pub fn request_with_id<T>(message: T, timeout: Duration, id: &str) -> Request<T> {
    let mut r = request(message, timeout);
    if let Ok(value) = MetadataValue::try_from(id) {
        r.metadata_mut().insert(REQUEST_ID_METADATA_KEY, value);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_128_bit_hex_and_differ() {
        let a = new_request_id();
        let b = new_request_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        let r = request_with_id((), Duration::from_secs(1), &a);
        assert_eq!(
            r.metadata()
                .get(REQUEST_ID_METADATA_KEY)
                .and_then(|v| v.to_str().ok()),
            Some(a.as_str())
        );
    }
}
