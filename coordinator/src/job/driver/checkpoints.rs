//! The checkpoint protocol's actions, as the driver carries them out, and the outcome of
//! `_metadata` writes and shard commits fed back to it.

use super::*;

impl Driver {
    pub(super) fn attempt_workers(&self) -> Option<(u64, Vec<String>)> {
        match &self.phase {
            Phase::Deploying(d) => Some((self.attempt, d.workers.clone())),
            Phase::Running(r) => Some((self.attempt, r.workers.clone())),
            _ => None,
        }
    }

    /// Sends `msg` to the running attempt's workers (none when it is not running).
    pub(super) fn to_running(&self, msg: cm::Msg, acts: &mut Vec<Action>) {
        if let Phase::Running(r) = &self.phase {
            acts.push(Action::Send {
                workers: r.workers.clone(),
                msg: Box::new(msg),
            });
        }
    }

    pub(super) fn protocol_actions(
        &mut self,
        now: u64,
        actions: Vec<ckpt::Action>,
        acts: &mut Vec<Action>,
    ) {
        for a in actions {
            match a {
                ckpt::Action::Trigger { id, mode, .. } => {
                    let last = matches!(&self.phase, Phase::Running(r) if r.final_id == Some(id));
                    let msg =
                        control::trigger(self.attempt, id, mode == BarrierMode::Unaligned, last);
                    self.to_running(msg, acts);
                }
                ckpt::Action::Abort { id, reason } => self.aborted(now, id, reason, acts),
                ckpt::Action::WriteMetadata { path, metadata } => {
                    self.writes.insert(path.clone(), metadata.clone());
                    acts.push(Action::WriteMetadata { path, metadata });
                }
                ckpt::Action::NotifyComplete { id } => {
                    self.to_running(control::complete(self.attempt, id), acts)
                }
                ckpt::Action::CommitShards { id, retained } => {
                    if self.managed_state {
                        acts.push(Action::CommitState { id, retained });
                    } else {
                        self.checkpoint_done(now, id, acts);
                    }
                }
                ckpt::Action::Discard { id } => acts.push(Action::DeleteCheckpoint { id }),
                ckpt::Action::SavepointCompleted { id, name, path } => {
                    tracing::info!(job = %self.config.job_id, %name, %path, "savepoint written");
                    if let Some(sp) = self.savepoints.get_mut(&id) {
                        sp.copy = Some(Ok(path));
                    }
                    self.maybe_savepoint_done(now, id, acts);
                }
                ckpt::Action::SavepointFailed { name, failure } => {
                    tracing::warn!(job = %self.config.job_id, %name, ?failure, "savepoint failed");
                    // An abort was answered with the abort; this is about the named copy.
                    let message = match failure {
                        SavepointFailure::Aborted(_) => continue,
                        SavepointFailure::NameTaken => {
                            format!("a savepoint named `{name}` exists already")
                        }
                        SavepointFailure::CopyFailed(e) => {
                            format!("writing savepoint `{name}` failed: {e}")
                        }
                    };
                    let id = self
                        .savepoints
                        .iter()
                        .find(|(_, sp)| sp.name == name)
                        .map(|(id, _)| *id);
                    if let Some(id) = id {
                        if let Some(sp) = self.savepoints.get_mut(&id) {
                            sp.copy = Some(Err(message));
                        }
                        self.maybe_savepoint_done(now, id, acts);
                    }
                }
                ckpt::Action::Fenced { id } => {
                    self.fenced = true;
                    let f = Failure::system(format!(
                        "another coordinator committed checkpoint {id} of this job; this one stepped down"
                    ));
                    self.fail_attempt(now, f, None, acts);
                }
            }
        }
    }

    /// Checkpoint `id` was aborted.
    pub(super) fn aborted(
        &mut self,
        now: u64,
        id: u64,
        reason: AbortReason,
        acts: &mut Vec<Action>,
    ) {
        self.status.checkpoints_aborted += 1;
        if let Phase::Running(run) = &self.phase
            && run.final_id == Some(id)
        {
            if run.final_triggers >= FINAL_CHECKPOINT_TRIES {
                let f = Failure::system(format!(
                    "the final checkpoint failed {} times; the last: {reason:?}",
                    run.final_triggers
                ));
                return self.fail_attempt(now, f, None, acts);
            }
            tracing::warn!(job = %self.config.job_id, id, ?reason, "final checkpoint aborted; taking another");
            return self.trigger_final(now, acts);
        }
        tracing::info!(job = %self.config.job_id, id, ?reason, "checkpoint aborted");
        self.to_running(control::abort(self.attempt, id), acts);
        let message = format!("checkpoint {id} was aborted: {reason:?}");
        if let Some(sp) = self.savepoints.remove(&id) {
            acts.push(refuse(sp.reply, message.clone()));
            if sp.then_stop {
                self.periodic(true);
            }
        }
        if self
            .rescale
            .as_ref()
            .is_some_and(|r| matches!(r.stage, RescaleStage::Checkpoint { id: c } if c == id))
            && let Some(r) = self.rescale.take()
        {
            acts.push(refuse(r.reply, message));
            self.periodic(true);
        }
    }

    pub(super) fn periodic(&mut self, on: bool) {
        if let Some(p) = self.protocol.as_mut() {
            p.set_periodic(on);
        }
    }

    pub(super) fn on_metadata_written(
        &mut self,
        now: u64,
        path: String,
        outcome: Result<CreateOutcome, String>,
        acts: &mut Vec<Action>,
    ) {
        let Some(metadata) = self.writes.remove(&path) else {
            return;
        };
        let Some(p) = self.protocol.as_mut() else {
            return;
        };
        let copy = metadata
            .savepoint
            .as_deref()
            .and_then(|name| store::savepoint_path(&self.config.job_id, name).ok())
            .is_some_and(|sp| sp == path);
        let out = if copy {
            let name = metadata.savepoint.clone().unwrap_or_default();
            p.savepoint_written(&name, outcome)
        } else {
            if matches!(outcome, Ok(CreateOutcome::Created)) {
                self.status
                    .record_checkpoint(CheckpointRecord::of(&metadata, now));
                self.latest = Some((*metadata).clone());
            }
            p.metadata_written(now, metadata.checkpoint_id, outcome)
        };
        self.protocol_actions(now, out, acts);
    }

    /// Checkpoint `id` is committed everywhere (metadata and shards).
    pub(super) fn checkpoint_done(&mut self, now: u64, id: u64, acts: &mut Vec<Action>) {
        // The job's dependencies answer again: a later outage waits from the start.
        self.unavailable_tries = 0;
        self.unavailable_since = None;
        if let Some(sp) = self.savepoints.get_mut(&id) {
            sp.committed = true;
            self.maybe_savepoint_done(now, id, acts);
        }
        let rescaling = self
            .rescale
            .as_ref()
            .is_some_and(|r| matches!(r.stage, RescaleStage::Checkpoint { id: c } if c == id));
        if rescaling {
            self.rescale_checkpointed(now, id, acts);
        }
    }

    /// A savepoint is answered once its copy is written and its shards committed.
    pub(super) fn maybe_savepoint_done(&mut self, now: u64, id: u64, acts: &mut Vec<Action>) {
        let done = self
            .savepoints
            .get(&id)
            .is_some_and(|sp| sp.committed && sp.copy.is_some());
        if !done {
            return;
        }
        let sp = self.savepoints.remove(&id).expect("checked above");
        match (sp.copy.expect("checked above"), sp.then_stop) {
            (Ok(path), false) => acts.push(reply_to(sp.reply, Answer::Savepoint(path))),
            (Ok(path), true) => self.begin_stopping(now, sp.reply, id, path, acts),
            (Err(e), then_stop) => {
                let e = if then_stop {
                    format!("{e}; the job was not stopped")
                } else {
                    e
                };
                acts.push(refuse(sp.reply, e));
                if then_stop {
                    self.periodic(true);
                }
            }
        }
    }
}
