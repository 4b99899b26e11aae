//! Runs a [`PhysicalPlan`] inside this process: the embedded local runtime.
//!
//! Every subtask of every chain becomes a tokio task on the current (multi-threaded)
//! runtime, so parallelism > 1 runs in parallel on as many cores as the runtime has.
//! Chains are wired with byte-bounded queues (`crate::queue`) by `runtime::build` (the
//! one-worker case). [`run_tasks`] is shared with the cluster worker: the first task to
//! fail cancels the others, and its error (not the knock-on "downstream gone" ones) is
//! returned.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::plan::PhysicalPlan;
use crate::runtime::build::{self, BuildOptions, Placement};
use crate::runtime::metrics::JobMetrics;
use crate::runtime::task::Task;

/// Settings of the local runtime.
pub type LocalOptions = BuildOptions;

/// Runs `plan` to completion (bounded inputs) or failure.
pub async fn run(
    plan: &PhysicalPlan,
    metrics: Arc<JobMetrics>,
    options: &LocalOptions,
) -> Result<()> {
    let mut options = options.clone();
    let store = build::job_store(plan, &options)?;
    options.first_epoch = store.open().await? + 1;
    options.state = Some(store.clone());
    let placement = Placement::round_robin(plan, 1);
    let tasks = build::build_tasks(plan, &metrics, &options, &placement, 0, None).await?;
    run_tasks(tasks).await?;
    let epoch = store.last_sealed();
    if epoch > 0 {
        // Every task sealed its last epoch at the end of input: with no coordinator to
        // commit checkpoints, the finished run commits that epoch as its checkpoint.
        store.commit(epoch, &[epoch]).await?;
    }
    Ok(())
}

/// Runs `tasks` to the end; the first root-cause error cancels the rest and is returned.
pub async fn run_tasks(tasks: Vec<Task>) -> Result<()> {
    let (cancel_tx, cancel_rx) = watch::channel(false);
    let mut set = JoinSet::new();
    for task in tasks {
        set.spawn(task.run(cancel_rx.clone()));
    }
    let mut first: Option<Error> = None;
    while let Some(joined) = set.join_next().await {
        let result = joined.map_err(|e| Error::Internal(format!("a task panicked: {e}")))?;
        if let Err(e) = result {
            let _ = cancel_tx.send(true);
            if first
                .as_ref()
                .is_none_or(|f| f.is_knock_on() && !e.is_knock_on())
            {
                first = Some(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}
