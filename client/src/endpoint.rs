//! Endpoint addresses: `host:port`, `[v6]:port`, `http://host:port`, or a bare host (port 7001).

use crate::error::{Error, Result};

/// The port `conchd` listens on by default.
pub const DEFAULT_PORT: u16 = 7001;

/// The endpoint the CLI uses when none is given: the local node's default address.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:7001";

/// A parsed endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EndpointAddr {
    /// `host:port` (IPv6 hosts in brackets), as shown to users and compared with leader hints.
    pub addr: String,
    /// The URI the channel connects to (`http://host:port`).
    pub uri: String,
}

/// Parses one endpoint.
///
/// Accepts `host:port`, `[::1]:port`, `http://host:port` (a trailing `/` is ignored) and a bare
/// `host`, which gets port [`DEFAULT_PORT`]. `https://` is refused: TLS is not chosen per
/// endpoint but for all of them, with [`ClientConfig::tls`](crate::ClientConfig::tls).
///
/// ```
/// use conch_client::parse_endpoint;
///
/// assert_eq!(parse_endpoint("node1:7002").unwrap().uri, "http://node1:7002");
/// assert_eq!(parse_endpoint("http://10.0.0.5:7001/").unwrap().addr, "10.0.0.5:7001");
/// assert_eq!(parse_endpoint("node2").unwrap().addr, "node2:7001");
/// assert!(parse_endpoint("node1:http").is_err());
/// ```
pub fn parse_endpoint(input: &str) -> Result<EndpointAddr> {
    let bad = |reason: &str| Error::InvalidEndpoint {
        endpoint: input.to_string(),
        reason: reason.to_string(),
    };
    let mut s = input.trim();
    if let Some(rest) = s.strip_prefix("http://") {
        s = rest;
    } else if s.starts_with("https://") {
        return Err(bad(
            "give host:port; TLS is chosen for every endpoint at once (--cacert, ClientConfig::tls)",
        ));
    } else if s.contains("://") {
        return Err(bad("only http:// or host:port endpoints are supported"));
    }
    let s = s.strip_suffix('/').unwrap_or(s);
    if s.is_empty() {
        return Err(bad("empty endpoint"));
    }
    if s.contains('/') || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad("expected host:port"));
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(bad("unclosed '[' in IPv6 address"));
        };
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err(bad("expected :port after the IPv6 address")),
            },
        };
        (format!("[{host}]"), port)
    } else {
        match s.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => {
                return Err(bad("put IPv6 addresses in brackets, e.g. [::1]:7001"));
            }
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("missing host"));
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(bad("port must be a number from 1 to 65535")),
            Ok(n) => n,
        },
    };
    let addr = format!("{host}:{port}");
    Ok(EndpointAddr {
        uri: format!("http://{addr}"),
        addr,
    })
}

/// Parses a comma (or whitespace) separated list of endpoints, dropping duplicates and empty
/// items. An empty list is an error.
///
/// ```
/// use conch_client::parse_endpoints;
///
/// let eps = parse_endpoints("node1:7001, node2:7001,node1:7001").unwrap();
/// assert_eq!(eps.len(), 2);
/// ```
pub fn parse_endpoints(list: &str) -> Result<Vec<EndpointAddr>> {
    let mut out: Vec<EndpointAddr> = Vec::new();
    for item in list.split(|c: char| c == ',' || c.is_whitespace()) {
        if item.is_empty() {
            continue;
        }
        let ep = parse_endpoint(item)?;
        if !out.contains(&ep) {
            out.push(ep);
        }
    }
    if out.is_empty() {
        return Err(Error::InvalidEndpoint {
            endpoint: list.to_string(),
            reason: "no endpoints given".to_string(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_usual_spellings() {
        let cases = [
            ("127.0.0.1:7001", "127.0.0.1:7001"),
            ("  node1:7002 ", "node1:7002"),
            ("http://node1:7002", "node1:7002"),
            ("http://node1:7002/", "node1:7002"),
            ("node1", "node1:7001"),
            ("[::1]:7003", "[::1]:7003"),
            ("[::1]", "[::1]:7001"),
            ("localhost:1", "localhost:1"),
        ];
        for (input, addr) in cases {
            let ep = parse_endpoint(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(ep.addr, addr, "{input}");
            assert_eq!(ep.uri, format!("http://{addr}"), "{input}");
        }
    }

    #[test]
    fn refuses_what_cannot_work_with_a_reason() {
        let cases = [
            ("", "empty"),
            ("https://node1:7001", "TLS"),
            ("grpc://node1:7001", "only http"),
            ("node1:0", "port"),
            ("node1:70000", "port"),
            ("node1:abc", "port"),
            (":7001", "missing host"),
            ("::1:7001", "brackets"),
            ("[::1", "unclosed"),
            ("[::1]7001", "expected :port"),
            ("node1:7001/x", "host:port"),
        ];
        for (input, why) in cases {
            let err = parse_endpoint(input).expect_err(input).to_string();
            assert!(err.contains(why), "{input}: {err}");
        }
    }

    #[test]
    fn lists_split_on_commas_and_spaces_and_drop_duplicates() {
        let eps = parse_endpoints("a:1,b:2 c:3,,a:1").unwrap();
        let addrs: Vec<_> = eps.iter().map(|e| e.addr.as_str()).collect();
        assert_eq!(addrs, ["a:1", "b:2", "c:3"]);
        assert!(parse_endpoints(" , ").is_err());
        assert!(parse_endpoints("a:1,b:x").is_err());
    }
}
