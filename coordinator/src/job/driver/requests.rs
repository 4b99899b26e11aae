//! User requests: savepoint, stop, rescale and cancel, from the request to the answer.

use super::*;

impl Driver {
    pub(super) fn on_request(
        &mut self,
        now: u64,
        reply: ReplyId,
        request: Request,
        acts: &mut Vec<Action>,
    ) {
        match request {
            Request::Cancel => self.on_cancel(now, reply, Answer::Cancelled, acts),
            Request::Stop { savepoint: None } => {
                let answer = Answer::Stopped(StopOutcome {
                    savepoint: String::new(),
                    warning: None,
                });
                self.on_cancel(now, reply, answer, acts)
            }
            Request::Stop {
                savepoint: Some(name),
            } => self.on_savepoint(now, reply, name, true, acts),
            Request::Savepoint { name } => self.on_savepoint(now, reply, name, false, acts),
            Request::Rescale { parallelism } => self.on_rescale(now, reply, parallelism, acts),
            Request::MoveShards { off, live } => self.on_move_shards(now, reply, off, live, acts),
        }
    }

    /// Why a checkpoint-taking request cannot be taken now, if it cannot.
    pub(super) fn busy(&self) -> Option<String> {
        const LATER: &str = "; try again once it runs";
        match &self.phase {
            Phase::Created | Phase::Connecting => Some(format!("the job is starting{LATER}")),
            Phase::Scheduling => Some(format!(
                "the job is being scheduled (waiting for {}){LATER}",
                self.status.waiting_for.as_deref().unwrap_or("workers")
            )),
            Phase::Deploying(_) => Some(format!(
                "the job is being deployed (attempt {}){LATER}",
                self.attempt
            )),
            Phase::Cancelling(_) => Some("the job is stopping its tasks".into()),
            Phase::BackingOff { .. } | Phase::FindingRestorePoint => {
                Some(format!("the job is restarting after a failure{LATER}"))
            }
            Phase::Done => Some("the job has ended".into()),
            Phase::Running(run) => {
                if self.protocol.is_none() {
                    Some(
                        "the job takes no checkpoints (set `checkpoint: { interval: ... }`)".into(),
                    )
                } else if run.final_id.is_some() {
                    Some("the job is finishing: its final checkpoint is being taken".into())
                } else if run.stopping.is_some() || self.savepoints.values().any(|s| s.then_stop) {
                    Some("the job is being stopped".into())
                } else {
                    self.rescale.as_ref().map(|r| {
                        format!("the job is being rescaled to parallelism {}", r.parallelism)
                    })
                }
            }
        }
    }

    pub(super) fn on_savepoint(
        &mut self,
        now: u64,
        reply: ReplyId,
        name: String,
        then_stop: bool,
        acts: &mut Vec<Action>,
    ) {
        if let Some(why) = self.busy() {
            return acts.push(refuse(reply, why));
        }
        let p = self.protocol.as_mut().expect("busy() checks it");
        let out = match p.trigger_savepoint(now, &name) {
            Ok(out) => out,
            Err(e) => return acts.push(refuse(reply, e.to_string())),
        };
        if then_stop {
            // The job ends after this one.
            p.set_periodic(false);
        }
        if let Some(id) = triggered(&out) {
            self.savepoints.insert(
                id,
                SavepointRequest {
                    reply,
                    name,
                    then_stop,
                    copy: None,
                    committed: false,
                },
            );
        }
        self.protocol_actions(now, out, acts);
    }

    /// A drain or a rebalance of the state nodes: when the job's shards need to move,
    /// a checkpoint, then a redeploy whose connection places them again.
    pub(super) fn on_move_shards(
        &mut self,
        now: u64,
        reply: ReplyId,
        off: Option<String>,
        live: Vec<String>,
        acts: &mut Vec<Action>,
    ) {
        let placement = self
            .state_ref
            .as_ref()
            .map(|r| r.placement.clone())
            .unwrap_or_default();
        let mut held: BTreeMap<&str, usize> = live.iter().map(|e| (e.as_str(), 0)).collect();
        for p in &placement {
            *held.entry(p.endpoint.as_str()).or_default() += 1;
        }
        let why_not = if placement.is_empty() {
            Some("the job's state is not placed over registered state nodes".to_owned())
        } else {
            match &off {
                Some(node) if !placement.iter().any(|p| &p.endpoint == node) => {
                    Some(format!("none of the job's shards is on {node}"))
                }
                Some(_) => None,
                None => {
                    let counts = live.iter().map(|e| held[e.as_str()]);
                    let (min, max) = (counts.clone().min(), counts.max());
                    let elsewhere = held.keys().any(|e| !live.iter().any(|l| l == e));
                    (!elsewhere && max.unwrap_or(0) - min.unwrap_or(0) <= 1).then(|| {
                        "the job's shards are spread evenly over the state nodes already".into()
                    })
                }
            }
        };
        if let Some(why) = why_not {
            let parallelism = graph::graph_parallelism(&self.graph);
            let outcome = self.unchanged(parallelism, format!("{why}; nothing was moved"));
            return acts.push(reply_to(reply, Answer::Rescaled(outcome)));
        }
        let current = graph::graph_parallelism(&self.graph);
        self.start_redeploy(now, reply, current, Some(off.is_none()), acts);
    }

    pub(super) fn on_rescale(
        &mut self,
        now: u64,
        reply: ReplyId,
        parallelism: u32,
        acts: &mut Vec<Action>,
    ) {
        let max = graph::max_parallelism(&self.graph);
        if parallelism == 0 || parallelism > max {
            return acts.push(refuse(
                reply,
                format!("parallelism must be between 1 and the job's max_parallelism ({max})"),
            ));
        }
        let current = graph::graph_parallelism(&self.graph);
        if parallelism == current && self.rescale.is_none() {
            let message = format!(
                "the job runs at parallelism {parallelism} already; nothing was redeployed"
            );
            let outcome = self.unchanged(parallelism, message);
            return acts.push(reply_to(reply, Answer::Rescaled(outcome)));
        }
        self.start_redeploy(now, reply, parallelism, None, acts);
    }

    /// A checkpoint at once, after which the job redeploys at `parallelism`, its shards
    /// placed again when `place` says so (`Some(balance)`).
    fn start_redeploy(
        &mut self,
        now: u64,
        reply: ReplyId,
        parallelism: u32,
        place: Option<bool>,
        acts: &mut Vec<Action>,
    ) {
        if let Some(why) = self.busy() {
            let why = if self.protocol.is_none() {
                let what = match place {
                    Some(_) => "moving the job's state shards",
                    None => "rescaling",
                };
                format!("{what} resumes from a checkpoint; {why}")
            } else {
                why
            };
            return acts.push(refuse(reply, why));
        }
        let current = graph::graph_parallelism(&self.graph);
        let p = self.protocol.as_mut().expect("busy() checks it");
        // An ordinary checkpoint, at once: retained like any other, not a savepoint.
        let out = p.trigger_now(now);
        let Some(id) = triggered(&out) else {
            return acts.push(refuse(
                reply,
                "no checkpoint can be taken (this coordinator was fenced)".into(),
            ));
        };
        // The job redeploys after this one.
        p.set_periodic(false);
        self.rescale = Some(RescaleRequest {
            reply,
            parallelism,
            from_parallelism: current,
            started_at: now,
            bytes_before: None,
            stage: RescaleStage::Checkpoint { id },
            place,
        });
        // A move reads its bytes from the new connection alone (see `rescaled`).
        if self.managed_state && place.is_none() {
            acts.push(Action::ReadRestoreBytes);
        }
        self.protocol_actions(now, out, acts);
    }

    /// The answer to a rescale or a move that had nothing to do.
    fn unchanged(&self, parallelism: u32, message: String) -> RescaleOutcome {
        RescaleOutcome {
            checkpoint_id: self.status.last_checkpoint.unwrap_or(0),
            millis: 0,
            state_bytes_restored: 0,
            parallelism,
            unchanged: true,
            message,
        }
    }

    pub(super) fn on_restore_bytes(&mut self, now: u64, bytes: u64, acts: &mut Vec<Action>) {
        let Some(r) = self.rescale.as_mut() else {
            return;
        };
        match r.stage {
            RescaleStage::Measure { checkpoint_id } => {
                self.rescaled(now, checkpoint_id, bytes, acts)
            }
            _ => {
                r.bytes_before.get_or_insert(bytes);
            }
        }
    }

    /// The rescale's checkpoint is committed: cancel the attempt, deploy anew from it.
    pub(super) fn rescale_checkpointed(&mut self, now: u64, id: u64, acts: &mut Vec<Action>) {
        let from = match self.latest.as_ref().filter(|m| m.checkpoint_id == id) {
            Some(m) => Box::new(m.clone()),
            None => {
                if let Some(r) = self.rescale.take() {
                    acts.push(refuse(r.reply, format!("checkpoint {id} left no metadata")));
                }
                return self.periodic(true);
            }
        };
        if let Some(r) = self.rescale.as_mut() {
            r.stage = RescaleStage::Redeploy { from };
        }
        self.transition(JobEvent::RescaleRequested);
        if let Some(p) = self.protocol.as_mut() {
            let out = p.abort_all(now, AbortReason::Rescale);
            self.protocol_actions(now, out, acts);
        }
        self.cancel_attempt(now, None, Then::Redeploy, acts);
    }

    /// The rescale's attempt is cancelled: the same job at the new parallelism.
    pub(super) fn redeploy(&mut self, acts: &mut Vec<Action>) {
        let Some(r) = self.rescale.as_mut() else {
            return;
        };
        let RescaleStage::Redeploy { from } = &r.stage else {
            return;
        };
        graph::set_parallelism(&mut self.graph, r.parallelism);
        self.status.parallelism = r.parallelism;
        self.restore = Some((**from).clone());
        let place = r.place;
        if let Some(p) = self.protocol.as_mut() {
            p.set_job_graph(
                Bytes::from(self.graph.encode_to_vec()),
                graph::node_parallelism(&self.graph),
            );
        }
        if let Some(balance) = place {
            // Placed again, off a drained node or evenly (see `Driver::place_again`).
            return self.place_again(balance, acts);
        }
        self.schedule(acts);
    }

    /// The new attempt runs: measure what the state service restored meanwhile.
    pub(super) fn rescale_deployed(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Some(r) = self.rescale.as_mut() else {
            return;
        };
        let RescaleStage::Redeploy { from } = &r.stage else {
            return;
        };
        let checkpoint_id = from.checkpoint_id;
        if self.managed_state {
            r.stage = RescaleStage::Measure { checkpoint_id };
            acts.push(Action::ReadRestoreBytes);
        } else {
            self.rescaled(now, checkpoint_id, 0, acts);
        }
    }

    pub(super) fn rescaled(
        &mut self,
        now: u64,
        checkpoint_id: u64,
        bytes_after: u64,
        acts: &mut Vec<Action>,
    ) {
        let Some(r) = self.rescale.take() else {
            return;
        };
        let millis = now.saturating_sub(r.started_at);
        let restored = match r.place {
            // A new connection to the state: all it read is the move's.
            Some(_) => bytes_after,
            None => bytes_after.saturating_sub(r.bytes_before.unwrap_or(bytes_after)),
        };
        let outcome = RescaleOutcome {
            checkpoint_id,
            millis,
            state_bytes_restored: restored,
            parallelism: r.parallelism,
            unchanged: false,
            message: match r.place {
                Some(_) => format!(
                    "moved the job's state shards: resumed from checkpoint {checkpoint_id} in \
                     {millis} ms, {restored} bytes read from the object store"
                ),
                None => format!(
                    "rescaled from parallelism {} to {}: resumed from checkpoint {checkpoint_id} in {millis} ms",
                    r.from_parallelism, r.parallelism
                ),
            },
        };
        acts.push(reply_to(r.reply, Answer::Rescaled(outcome)));
    }

    /// A stop's savepoint is taken: wait for every task to commit its output.
    pub(super) fn begin_stopping(
        &mut self,
        now: u64,
        reply: ReplyId,
        id: u64,
        path: String,
        acts: &mut Vec<Action>,
    ) {
        let Phase::Running(run) = &mut self.phase else {
            // The attempt ended meanwhile: nothing runs that could commit more.
            let outcome = StopOutcome {
                savepoint: path,
                warning: None,
            };
            return self.on_cancel(now, reply, Answer::Stopped(outcome), acts);
        };
        let waiting: BTreeSet<TaskId> = run
            .tasks
            .iter()
            .filter(|t| run.committed.get(t).is_none_or(|&c| c < id))
            .copied()
            .collect();
        run.stopping = Some(Stopping {
            reply,
            id,
            path,
            waiting,
            deadline: now + ms(self.config.stop_commit_timeout),
        });
        self.waiting_for("the tasks to commit the savepoint's output");
        self.maybe_stopped(now, acts);
    }

    pub(super) fn maybe_stopped(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        if let Some(s) = run.stopping.take_if(|s| s.waiting.is_empty()) {
            self.stopped(now, s, None, acts);
        }
    }

    pub(super) fn stopped(
        &mut self,
        now: u64,
        s: Stopping,
        warning: Option<String>,
        acts: &mut Vec<Action>,
    ) {
        let answer = Answer::Stopped(StopOutcome {
            savepoint: s.path,
            warning,
        });
        self.on_cancel(now, s.reply, answer, acts);
    }

    /// Cancel (or stop without a savepoint): taken in every state.
    pub(super) fn on_cancel(
        &mut self,
        now: u64,
        reply: ReplyId,
        answer: Answer,
        acts: &mut Vec<Action>,
    ) {
        match &mut self.phase {
            Phase::Created
            | Phase::Connecting
            | Phase::Scheduling
            | Phase::BackingOff { .. }
            | Phase::FindingRestorePoint => {
                self.answer_all("the job was cancelled", acts);
                acts.push(Action::ReleaseSlots);
                acts.push(reply_to(reply, answer));
                self.finish(JobEvent::Cancel);
            }
            Phase::Deploying(_) | Phase::Running(_) => {
                self.answer_all("the job was cancelled", acts);
                self.periodic(false);
                if let Some(p) = self.protocol.as_mut() {
                    let out = p.abort_all(now, AbortReason::Cancelled);
                    self.protocol_actions(now, out, acts);
                }
                let then = Then::End {
                    state: JobState::Cancelled,
                    replies: vec![(reply, answer)],
                };
                self.cancel_attempt(now, None, then, acts);
            }
            Phase::Cancelling(c) => match &mut c.then {
                Then::End { replies, .. } => replies.push((reply, answer)),
                Then::Settle(_) | Then::Redeploy => {
                    c.then = Then::End {
                        state: JobState::Cancelled,
                        replies: vec![(reply, answer)],
                    };
                    self.answer_all("the job was cancelled", acts);
                }
            },
            Phase::Done => acts.push(refuse(reply, "the job has ended".into())),
        }
    }

    /// Answers every request still waiting with `why`.
    pub(super) fn answer_all(&mut self, why: &str, acts: &mut Vec<Action>) {
        self.answer_requests(why, acts);
        if let Phase::Running(run) = &mut self.phase
            && let Some(s) = run.stopping.take()
        {
            acts.push(refuse(
                s.reply,
                format!("{why} while stopping; savepoint {} is written", s.path),
            ));
        }
    }

    /// Answers savepoints, stops waiting for their savepoint and a rescale with `why`.
    pub(super) fn answer_requests(&mut self, why: &str, acts: &mut Vec<Action>) {
        self.answer_savepoints(why, acts);
        if let Some(r) = self.rescale.take() {
            let why = match r.stage {
                RescaleStage::Checkpoint { .. } => why.to_string(),
                _ => format!(
                    "{why}; the job did not come up at parallelism {}",
                    r.parallelism
                ),
            };
            acts.push(refuse(r.reply, why));
        }
    }

    pub(super) fn answer_savepoints(&mut self, why: &str, acts: &mut Vec<Action>) {
        for (_, sp) in std::mem::take(&mut self.savepoints) {
            acts.push(refuse(sp.reply, why.to_string()));
        }
    }
}
