//! The job lifecycle: a typed state machine.
//!
//! ```text
//!  Created ─Schedule─▶ Scheduling ─Deployed─▶ Running ─AllFinished─▶ Finished
//!                        ▲    │                │  ▲ │
//!                        │  TaskFailed  RescaleRequested │ TaskFailed
//!                        │    ▼                ▼  │ ▼
//!                        │  Failing ◀─TaskFailed─ Rescaling (─Rescaled─▶ Running)
//!                        │   │   └─GiveUp─▶ Failed
//!                        │ Restart
//!                        │   ▼
//!                        └─Restarted── Restarting
//!
//!  Cancel: from every non-terminal state to Cancelled.
//! ```
//!
//! [`JobState::next`] is the only place a transition is decided; the driver calls it
//! for every event and acts only on `Ok`. Whether a failing job restarts or gives up is
//! the [`RestartPolicy`](super::RestartPolicy)'s decision; the lifecycle only records it
//! (`Restart` or `GiveUp`).

use std::fmt;

/// Where a job is in its life (in JSON, its lowercase name, as `Display` writes it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Accepted (graph validated and stored), nothing deployed yet.
    Created,
    /// Subtasks are being placed on slots and deployed; state shards opened.
    Scheduling,
    /// Every task is deployed and running.
    Running,
    /// A task failed; the remaining tasks are being cancelled.
    Failing,
    /// Waiting out the restart back-off (the job's state goes back to the checkpoint
    /// the next attempt resumes from when that attempt deploys).
    Restarting,
    /// A rescale was requested: checkpoint, then redeploy at the new parallelism.
    Rescaling,
    /// Every task finished (bounded input). Terminal.
    Finished,
    /// The user cancelled the job. Terminal.
    Cancelled,
    /// The restart strategy gave up. Terminal.
    Failed,
}

impl JobState {
    /// Every state, in declaration order (for tables and exhaustive tests).
    pub const ALL: [JobState; 9] = [
        JobState::Created,
        JobState::Scheduling,
        JobState::Running,
        JobState::Failing,
        JobState::Restarting,
        JobState::Rescaling,
        JobState::Finished,
        JobState::Cancelled,
        JobState::Failed,
    ];

    /// Whether no event can leave this state.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Cancelled | JobState::Failed
        )
    }

    /// The state after `event`, or why `event` cannot happen now. The one place where
    /// the job lifecycle is decided.
    pub fn next(self, event: JobEvent) -> Result<JobState, IllegalTransition> {
        use JobEvent as E;
        use JobState as S;
        let next = match (self, event) {
            (S::Created, E::Schedule) => S::Scheduling,
            (S::Scheduling, E::Deployed) => S::Running,
            (S::Scheduling | S::Running | S::Rescaling, E::TaskFailed) => S::Failing,
            (S::Running, E::RescaleRequested) => S::Rescaling,
            (S::Rescaling, E::Rescaled) => S::Running,
            (S::Running, E::AllFinished) => S::Finished,
            (S::Failing, E::Restart) => S::Restarting,
            (S::Failing, E::GiveUp) => S::Failed,
            (S::Restarting, E::Restarted) => S::Scheduling,
            (s, E::Cancel) if !s.is_terminal() => S::Cancelled,
            (from, event) => return Err(IllegalTransition { from, event }),
        };
        Ok(next)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            JobState::Created => "created",
            JobState::Scheduling => "scheduling",
            JobState::Running => "running",
            JobState::Failing => "failing",
            JobState::Restarting => "restarting",
            JobState::Rescaling => "rescaling",
            JobState::Finished => "finished",
            JobState::Cancelled => "cancelled",
            JobState::Failed => "failed",
        };
        f.write_str(name)
    }
}

/// What happened to a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JobEvent {
    /// Start placing the job's subtasks.
    Schedule,
    /// Every subtask is deployed and running.
    Deployed,
    /// A task failed, or the worker running it missed its heartbeats.
    TaskFailed,
    /// The restart policy decided to restart (after its back-off).
    Restart,
    /// The back-off passed: deploy again (rolling the state back is the deploy's).
    Restarted,
    /// The user asked for another parallelism.
    RescaleRequested,
    /// The rescale checkpoint completed and the tasks run at the new parallelism.
    Rescaled,
    /// The user cancelled the job.
    Cancel,
    /// Every task reached the end of its input.
    AllFinished,
    /// The restart policy gave up.
    GiveUp,
}

impl JobEvent {
    /// Every event, in declaration order (for exhaustive tests).
    pub const ALL: [JobEvent; 10] = [
        JobEvent::Schedule,
        JobEvent::Deployed,
        JobEvent::TaskFailed,
        JobEvent::Restart,
        JobEvent::Restarted,
        JobEvent::RescaleRequested,
        JobEvent::Rescaled,
        JobEvent::Cancel,
        JobEvent::AllFinished,
        JobEvent::GiveUp,
    ];
}

/// An event that cannot happen in the job's current state: a bug in the driver, or a
/// user request that does not fit (cancel a finished job, rescale a restarting one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a job that is {from} cannot take the event {event:?}")]
pub struct IllegalTransition {
    /// The state the job was in (and stays in).
    pub from: JobState,
    /// The event that was refused.
    pub event: JobEvent,
}

#[cfg(test)]
mod tests {
    use super::*;
    use JobEvent as E;
    use JobState as S;

    /// The complete transition table: every (state, event) pair not listed is illegal.
    const LEGAL: &[(JobState, JobEvent, JobState)] = &[
        (S::Created, E::Schedule, S::Scheduling),
        (S::Created, E::Cancel, S::Cancelled),
        (S::Scheduling, E::Deployed, S::Running),
        (S::Scheduling, E::TaskFailed, S::Failing),
        (S::Scheduling, E::Cancel, S::Cancelled),
        (S::Running, E::TaskFailed, S::Failing),
        (S::Running, E::RescaleRequested, S::Rescaling),
        (S::Running, E::AllFinished, S::Finished),
        (S::Running, E::Cancel, S::Cancelled),
        (S::Failing, E::Restart, S::Restarting),
        (S::Failing, E::GiveUp, S::Failed),
        (S::Failing, E::Cancel, S::Cancelled),
        (S::Restarting, E::Restarted, S::Scheduling),
        (S::Restarting, E::Cancel, S::Cancelled),
        (S::Rescaling, E::Rescaled, S::Running),
        (S::Rescaling, E::TaskFailed, S::Failing),
        (S::Rescaling, E::Cancel, S::Cancelled),
    ];

    #[test]
    fn every_state_and_event_pair_follows_the_table() {
        let mut checked = 0;
        for from in JobState::ALL {
            for event in JobEvent::ALL {
                let expected = LEGAL
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (from.next(event), expected) {
                    (Ok(to), Some(want)) => assert_eq!(to, want, "{from} --{event:?}-->"),
                    (Err(err), None) => {
                        assert_eq!(err, IllegalTransition { from, event });
                        assert!(err.to_string().contains(&from.to_string()));
                    }
                    (got, want) => panic!("{from} --{event:?}--> {got:?}, expected {want:?}"),
                }
                checked += 1;
            }
        }
        assert_eq!(checked, 90);
    }

    #[test]
    fn terminal_states_take_no_event() {
        for s in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for e in JobEvent::ALL {
                assert!(s.next(e).is_err(), "{s} must not take {e:?}");
            }
        }
        assert_eq!(JobState::ALL.iter().filter(|s| s.is_terminal()).count(), 3);
    }

    #[test]
    fn a_failure_restart_and_rescale_path() {
        let path = [
            (E::Schedule, S::Scheduling),
            (E::Deployed, S::Running),
            (E::TaskFailed, S::Failing),
            (E::Restart, S::Restarting),
            (E::Restarted, S::Scheduling),
            (E::Deployed, S::Running),
            (E::RescaleRequested, S::Rescaling),
            (E::Rescaled, S::Running),
            (E::TaskFailed, S::Failing),
            (E::GiveUp, S::Failed),
        ];
        let mut s = S::Created;
        for (e, want) in path {
            s = s.next(e).unwrap();
            assert_eq!(s, want);
        }
    }
}
