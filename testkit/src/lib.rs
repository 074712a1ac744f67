//! Test support shared by the client tests (in-process nodes) and the process-level harness
//! (`cluster-tests`): the fault-injecting TCP [`proxy`], and the loopback [`ports`] the nodes
//! listen on. It depends on tokio and anyhow only, so the client's tests can use it without
//! depending on the harness (which depends on the client).

pub mod ports;
pub mod proxy;

pub use ports::{free_port, free_ports};
pub use proxy::{LinkMode, LinkProxy};
