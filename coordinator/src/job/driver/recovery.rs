//! Failure, cancellation and restart: an attempt that fails or is cancelled, the
//! workers' confirmations, the restart policy's decision and the restore point.

use super::*;

impl Driver {
    /// The attempt failed: its requests are answered, its workers cancelled, and then
    /// the restart policy decides. `lost` is not told (it is gone).
    pub(super) fn fail_attempt(
        &mut self,
        now: u64,
        f: Failure,
        lost: Option<&str>,
        acts: &mut Vec<Action>,
    ) {
        if !matches!(self.phase, Phase::Deploying(_) | Phase::Running(_)) {
            return;
        }
        tracing::warn!(job = %self.config.job_id, attempt = self.attempt, "attempt failed: {}", f.reason);
        // A stop whose savepoint is taken ends the job as asked, failure or not.
        let stopping = match &mut self.phase {
            Phase::Running(run) => run.stopping.take(),
            _ => None,
        };
        if let Some(s) = stopping {
            let warning = format!(
                "the attempt failed before every task confirmed committing the savepoint's \
                 output ({}); what they did not commit becomes visible when a job resumes \
                 from the savepoint",
                f.reason
            );
            self.answer_requests(&format!("the job's attempt failed: {}", f.reason), acts);
            self.periodic(false);
            if let Some(p) = self.protocol.as_mut() {
                let out = p.abort_all(now, AbortReason::JobFailover);
                self.protocol_actions(now, out, acts);
            }
            let then = Then::End {
                state: JobState::Cancelled,
                replies: vec![(
                    s.reply,
                    Answer::Stopped(StopOutcome {
                        savepoint: s.path,
                        warning: Some(warning),
                    }),
                )],
            };
            return self.cancel_attempt(now, lost, then, acts);
        }
        self.record_failure(now, &f);
        self.status.user_error = f.user;
        self.answer_requests(&format!("the job's attempt failed: {}", f.reason), acts);
        self.transition(JobEvent::TaskFailed);
        self.periodic(false);
        if let Some(p) = self.protocol.as_mut() {
            let out = p.abort_all(now, AbortReason::JobFailover);
            self.protocol_actions(now, out, acts);
        }
        self.cancel_attempt(now, lost, Then::Settle(f), acts);
    }

    /// A failure before any attempt (the state service, the job's settings).
    pub(super) fn fail_unattempted(&mut self, now: u64, f: Failure) {
        self.transition(JobEvent::TaskFailed);
        self.record_failure(now, &f);
        self.status.user_error = f.user;
        self.settle(now, f);
    }

    /// Cancels the attempt on its workers (but `lost`); `then` follows once they
    /// confirmed or the cancel timeout passed.
    pub(super) fn cancel_attempt(
        &mut self,
        now: u64,
        lost: Option<&str>,
        then: Then,
        acts: &mut Vec<Action>,
    ) {
        let Some((attempt, workers)) = self.attempt_workers() else {
            return;
        };
        let workers: Vec<String> = workers
            .into_iter()
            .filter(|w| Some(w.as_str()) != lost)
            .collect();
        if !workers.is_empty() {
            acts.push(Action::Send {
                workers: workers.clone(),
                msg: Box::new(control::cancel(attempt)),
            });
        }
        self.phase = Phase::Cancelling(Cancelling {
            attempt,
            waiting: workers.into_iter().collect(),
            deadline: now + ms(self.config.cancel_timeout),
            then,
        });
        self.waiting_for("the workers to confirm the attempt's cancellation");
        self.cancelled(now, acts);
    }

    pub(super) fn cancel_confirmed(&mut self, now: u64, worker: &str, acts: &mut Vec<Action>) {
        if let Phase::Cancelling(c) = &mut self.phase {
            c.waiting.remove(worker);
        }
        self.cancelled(now, acts);
    }

    /// Once every worker confirmed the cancellation: what was to follow.
    pub(super) fn cancelled(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Phase::Cancelling(c) = &self.phase else {
            return;
        };
        if !c.waiting.is_empty() {
            return;
        }
        let Phase::Cancelling(c) = std::mem::replace(&mut self.phase, Phase::Created) else {
            unreachable!("matched above");
        };
        acts.push(Action::ReleaseSlots);
        self.status.workers.clear();
        match c.then {
            Then::Settle(f) => self.settle(now, f),
            Then::Redeploy => self.redeploy(acts),
            Then::End { state, replies } => {
                for (to, answer) in replies {
                    acts.push(reply_to(to, answer));
                }
                let event = match state {
                    JobState::Cancelled => JobEvent::Cancel,
                    JobState::Finished => JobEvent::AllFinished,
                    _ => JobEvent::GiveUp,
                };
                self.finish(event);
            }
        }
    }

    /// After a failed attempt (its workers stopped): restart after the back-off, or
    /// give up.
    pub(super) fn settle(&mut self, now: u64, f: Failure) {
        // A job without checkpoints could only start over, repeating its output.
        let give_up = if f.user || self.fenced || self.protocol.is_none() {
            Some(None)
        } else if let Some(why) = &self.not_restorable {
            Some(Some(format!("{}; not restarted: {why}", f.reason)))
        } else if f.unavailable {
            // Not the job's doing: wait for the dependency, spending no restart.
            let wait = self
                .config
                .restart
                .dependency_backoff(self.unavailable_tries);
            self.unavailable_tries = self.unavailable_tries.saturating_add(1);
            let since = *self.unavailable_since.get_or_insert(now);
            self.status.restarts += 1;
            self.transition(JobEvent::Restart);
            self.phase = Phase::BackingOff {
                until: now + ms(wait),
            };
            self.waiting_for(&format!(
                "{} (out of reach for {} s; trying again in {wait:?}; restarts for this do not \
                 count against the restart policy)",
                f.reason,
                now.saturating_sub(since) / 1000
            ));
            None
        } else {
            match self.config.restart.decide(self.restarts) {
                Decision::GiveUp => Some(Some(format!(
                    "{}; not restarted: the restart policy allows {} restarts and {} were made",
                    f.reason, self.config.restart.max_restarts, self.restarts
                ))),
                Decision::Restart(wait) => {
                    self.restarts += 1;
                    self.status.restarts += 1;
                    self.transition(JobEvent::Restart);
                    self.phase = Phase::BackingOff {
                        until: now + ms(wait),
                    };
                    self.waiting_for(&format!("the restart back-off ({wait:?})"));
                    None
                }
            }
        };
        if let Some(failure) = give_up {
            if let Some(failure) = failure {
                self.status.failure = Some(failure);
            }
            tracing::error!(job = %self.config.job_id, "job failed: {}", self.status.failure.as_deref().unwrap_or(""));
            self.finish(JobEvent::GiveUp);
        }
    }

    /// The newest valid checkpoint, after the back-off: deploy again from it.
    pub(super) fn on_latest(&mut self, m: Option<Box<CheckpointMetadata>>, acts: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::FindingRestorePoint) {
            return;
        }
        match m {
            Some(m) => self.restore = Some(*m),
            None if self.restore.is_none() => {
                // Nothing completed: start over, with sinks discarding what is pending.
                self.restore = Some(CheckpointMetadata {
                    job_id: self.config.job_id.clone(),
                    max_parallelism: self.graph.max_parallelism,
                    ..CheckpointMetadata::default()
                });
            }
            None => {}
        }
        self.transition(JobEvent::Restarted);
        let placed = self
            .state_ref
            .as_ref()
            .is_some_and(|r| !r.placement.is_empty());
        if placed || (self.managed_state && self.state_ref.is_none()) {
            // Shards placed over registered state nodes are placed again (a node the
            // last attempt used may be gone: its shards reopen on the survivors), or
            // the state service was not reached the first time.
            return self.place_again(false, acts);
        }
        self.schedule(acts);
    }
}
