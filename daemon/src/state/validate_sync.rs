//! The static checks of wait group and barrier commands (see `validate` for who calls them).
//! Messages name the request field in Grackle's words.

use super::limits::{JOBS_PER_CALL_MAX, SYNC_RETENTION_MIN_S};
use super::sync_types::{BarrierCmd, WaitGroupCmd};
use super::types::Error;
use super::validate::{description, metadata, name};

const NAMESPACE_NAME: &str = "namespace_name";

fn positive(field: &str, value: u64) -> Result<(), Error> {
    if value == 0 {
        return Err(Error::invalid(format!("{field} must be greater than 0")));
    }
    Ok(())
}

/// The retention and inactivity windows: at least [`SYNC_RETENTION_MIN_S`], and at most what
/// an int64 holds on the wire.
fn retention(field: &str, value: u64) -> Result<(), Error> {
    if value < SYNC_RETENTION_MIN_S || value > i64::MAX as u64 {
        return Err(Error::invalid(format!(
            "{field} must be greater than or equal to {SYNC_RETENTION_MIN_S}"
        )));
    }
    Ok(())
}

pub(super) fn wait_group(cmd: &WaitGroupCmd) -> Result<(), Error> {
    name(NAMESPACE_NAME, cmd.ns())?;
    name("wait_group_name", cmd.name())?;
    match cmd {
        WaitGroupCmd::Create {
            description: d,
            counter,
            delete_after_finished_s,
            metadata: m,
            ..
        }
        | WaitGroupCmd::Update {
            description: d,
            counter,
            delete_after_finished_s,
            metadata: m,
            ..
        } => {
            description(d)?;
            positive("counter", *counter)?;
            retention("delete_after_finished_seconds", *delete_after_finished_s)?;
            metadata(m)
        }
        WaitGroupCmd::Delete { .. } => Ok(()),
        WaitGroupCmd::Complete { jobs, .. } => {
            if jobs.len() > JOBS_PER_CALL_MAX {
                return Err(Error::invalid(format!(
                    "jobs must be at most {JOBS_PER_CALL_MAX} per call"
                )));
            }
            for job in jobs {
                name("job_id", &job.job_id)?;
                metadata(&job.metadata)?;
            }
            Ok(())
        }
    }
}

pub(super) fn barrier(cmd: &BarrierCmd) -> Result<(), Error> {
    name(NAMESPACE_NAME, cmd.ns())?;
    name("barrier_name", cmd.name())?;
    match cmd {
        BarrierCmd::Create {
            description: d,
            expected,
            delete_inactive_after_s,
            metadata: m,
            ..
        }
        | BarrierCmd::Update {
            description: d,
            expected,
            delete_inactive_after_s,
            metadata: m,
            ..
        } => {
            description(d)?;
            positive("expected_processes", *expected)?;
            retention("delete_inactive_after_seconds", *delete_inactive_after_s)?;
            metadata(m)
        }
        BarrierCmd::Delete { .. } => Ok(()),
        BarrierCmd::Arrive {
            process_id,
            expected_generation,
            metadata: m,
            ..
        } => {
            name("process_id", process_id)?;
            positive("expected_generation", *expected_generation)?;
            metadata(m)
        }
    }
}
