//! Test support shared by the client tests (in-process nodes) and the process-level harness
//! (`cluster-tests`): the fault-injecting TCP [`proxy`]. Nodes need no port scheme: a test binds
//! each node's port itself and hands the listener over. It depends on tokio and anyhow only, so
//! the client's tests can use it without depending on the harness (which depends on the client).

pub mod proxy;

pub use proxy::{LinkMode, LinkProxy};
