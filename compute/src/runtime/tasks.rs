//! Runs the tasks a worker built: every task is a tokio task on the current
//! (multi-threaded) runtime, so subtasks run in parallel on as many cores as the runtime
//! has. The first task to fail cancels the others, and its error (not the knock-on
//! "downstream gone" ones) is returned.

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::runtime::task::Task;

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
