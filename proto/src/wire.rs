//! What both ends of the wire agree on besides the messages: the metadata keys conch's calls
//! carry and the limits the server checks requests against (which the client checks first, to
//! say what is wrong before calling). conchd and the client library both take them from here.

/// Request metadata naming the logical write a call belongs to: every attempt of one write
/// carries the same id, and the server answers a retry with the first attempt's reply.
pub const REQUEST_ID_HEADER: &str = "conch-request-id";
/// Response metadata naming the leader's client address, so clients can go there directly.
pub const LEADER_HEADER: &str = "conch-leader";
/// Request metadata carrying a token (`Bearer <token>`) while access control is on.
pub const AUTHORIZATION: &str = "authorization";

/// Peer calls: the sender's cluster id.
pub const CLUSTER_ID_HEADER: &str = "conch-cluster-id";
/// Peer calls: the sender's node id.
pub const PEER_ID_HEADER: &str = "conch-peer-id";
/// Peer calls: the peer secret (its SHA-256, hex).
pub const PEER_SECRET_HEADER: &str = "conch-peer-secret";
/// Peer calls: the sender's client address, so a follower can point clients at the leader's
/// client port when peers have a port of their own.
pub const CLIENT_ADDR_HEADER: &str = "conch-client-addr";
/// Peer calls: the sender's cluster name, when it has one.
pub const CLUSTER_NAME_HEADER: &str = "conch-cluster-name";
/// Peer calls: the node a Raft RPC is meant for.
pub const PEER_TARGET_HEADER: &str = "conch-peer-target";

/// Longest namespace or semaphore name (characters of `[-_.0-9a-zA-Z]`).
pub const NAME_MAX_CHARS: usize = 128;
/// Longest metadata value, in bytes.
pub const METADATA_VALUE_MAX_BYTES: usize = 256;
/// Longest lease `process_id`, in bytes.
pub const PROCESS_ID_MAX_BYTES: usize = 128;
/// Most permits a semaphore has.
pub const PERMITS_MAX: u64 = u32::MAX as u64;
/// Longest request id (`conch-request-id`): ASCII letters, digits, `-` or `_`.
pub const REQUEST_ID_MAX_BYTES: usize = 64;
