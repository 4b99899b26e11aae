//! Scheduling and deploying an attempt: the state service, slots, `Prepare`, the
//! shards' rollback, `Deploy`, until every worker runs its tasks.

use super::*;

impl Driver {
    pub(super) fn on_state_connected(
        &mut self,
        now: u64,
        r: Result<pbc::RemoteStateRef, Failure>,
        acts: &mut Vec<Action>,
    ) {
        if !matches!(self.phase, Phase::Connecting) {
            return;
        }
        self.balance = false;
        match r {
            Ok(reference) => {
                if let Some(p) = &mut self.protocol {
                    p.set_placement(
                        reference
                            .placement
                            .iter()
                            .map(|s| {
                                let range = ShardRange {
                                    start: s.key_group_start,
                                    end: s.key_group_end,
                                };
                                (range, s.endpoint.clone())
                            })
                            .collect(),
                    );
                }
                self.state_ref = Some(reference);
                self.schedule(acts);
            }
            Err(f) => {
                if let Some(r) = self.rescale.take() {
                    acts.push(refuse(r.reply, format!("the job's state: {}", f.reason)));
                }
                self.fail_unattempted(now, f)
            }
        }
    }

    /// Connects to the job's state again, so that its shards are placed again (off
    /// nodes that are gone or drained; evenly over the nodes with `balance`) before the
    /// next attempt is scheduled.
    pub(super) fn place_again(&mut self, balance: bool, acts: &mut Vec<Action>) {
        if let Some(r) = self.state_ref.take() {
            self.last_placement = Some(r.placement);
        }
        self.balance = balance;
        self.phase = Phase::Connecting;
        self.waiting_for("the state service");
        acts.push(Action::ConnectState);
    }

    /// Whether the next connection spreads the shards evenly (a rebalance).
    pub fn balancing(&self) -> bool {
        self.balance
    }

    /// Where the job's shards are, by key-group range: this attempt's placement, else
    /// that of the checkpoint the next attempt restores (empty: not known).
    pub fn placement(&self) -> Vec<(std::ops::Range<u32>, String)> {
        let current = self.state_ref.as_ref().map(|r| &r.placement);
        match current.or(self.last_placement.as_ref()) {
            Some(placement) if !placement.is_empty() => placement
                .iter()
                .map(|s| (s.key_group_start..s.key_group_end, s.endpoint.clone()))
                .collect(),
            _ => self
                .restore
                .iter()
                .flat_map(|m| &m.shards)
                .filter(|s| !s.node.is_empty())
                .map(|s| (s.range.start..s.range.end, s.node.clone()))
                .collect(),
        }
    }

    /// A new attempt: slots first.
    pub(super) fn schedule(&mut self, acts: &mut Vec<Action>) {
        self.attempt += 1;
        self.status.attempt = self.attempt;
        self.phase = Phase::Scheduling;
        let n = self.workers_needed();
        self.waiting_for(&format!("workers with a free slot: 0 of {n}"));
        acts.push(Action::AcquireSlots { workers: n });
    }

    pub(super) fn on_slots(&mut self, now: u64, workers: Vec<String>, acts: &mut Vec<Action>) {
        if !matches!(self.phase, Phase::Scheduling) {
            // Cancelled meanwhile.
            acts.push(Action::ReleaseSlots);
            return;
        }
        self.status.workers = workers.clone();
        acts.push(Action::Send {
            workers: workers.clone(),
            msg: Box::new(control::prepare(&self.config.job_id, self.attempt)),
        });
        let n = workers.len();
        self.phase = Phase::Deploying(Deploying {
            workers,
            deadline: now + ms(self.config.deploy_timeout),
            step: DeployStep::Preparing {
                addresses: BTreeMap::new(),
            },
            reports: BTreeMap::new(),
            finished: BTreeSet::new(),
        });
        self.waiting_for(&format!("workers to bind their data ports: 0 of {n}"));
    }

    /// A message while the attempt is deployed.
    pub(super) fn on_deploying_message(
        &mut self,
        now: u64,
        worker: String,
        msg: wm::Msg,
        acts: &mut Vec<Action>,
    ) {
        let attempt = self.attempt;
        let Phase::Deploying(d) = &mut self.phase else {
            return;
        };
        if !d.workers.contains(&worker) {
            return;
        }
        match msg {
            wm::Msg::Prepared(p) if p.attempt == attempt => {
                let DeployStep::Preparing { addresses } = &mut d.step else {
                    return;
                };
                if !p.error.is_empty() {
                    let f = Failure::system(format!("worker {worker}: {}", p.error));
                    return self.fail_attempt(now, f, None, acts);
                }
                addresses.insert(worker, p.data_address);
                let (got, n) = (addresses.len(), d.workers.len());
                if got < n {
                    self.waiting_for(&format!("workers to bind their data ports: {got} of {n}"));
                    return;
                }
                let peers: Vec<String> = d.workers.iter().map(|w| addresses[w].clone()).collect();
                self.prepared(now, peers, acts);
            }
            wm::Msg::Deployed(dep) if dep.attempt == attempt => {
                let DeployStep::Deploying { deployed, tasks } = &mut d.step else {
                    return;
                };
                if !dep.error.is_empty() {
                    let f = Failure {
                        reason: format!("worker {worker}: {}", dep.error),
                        user: dep.user_error,
                        unavailable: dep.unavailable,
                    };
                    return self.fail_attempt(now, f, None, acts);
                }
                tasks.extend(dep.tasks.iter().map(control::task_id));
                deployed.insert(worker);
                let (got, n) = (deployed.len(), d.workers.len());
                if got < n {
                    self.waiting_for(&format!("workers to deploy their tasks: {got} of {n}"));
                    return;
                }
                self.deployed(now, acts);
            }
            wm::Msg::Report(r) if r.attempt == attempt => {
                if !r.error.is_empty() {
                    let f = Failure {
                        reason: format!("worker {worker}: {}", r.error),
                        user: r.user_error,
                        unavailable: r.unavailable,
                    };
                    return self.fail_attempt(now, f, None, acts);
                }
                if r.cancelled {
                    let f = Failure::system(format!("worker {worker} cancelled the attempt"));
                    return self.fail_attempt(now, f, None, acts);
                }
                if r.r#final {
                    // A worker without tasks ends at once, maybe before the others
                    // deployed.
                    d.reports.insert(worker, r);
                }
            }
            wm::Msg::Ack(a) if a.attempt == attempt && a.finished => {
                // A task without input (a source without splits) finishes at once.
                if let Some(t) = &a.task {
                    d.finished.insert(control::task_id(t));
                }
            }
            // Late answers of earlier attempts; progress before every worker deployed.
            _ => {}
        }
    }

    /// Every worker bound its data port: state, then deploy.
    pub(super) fn prepared(&mut self, now: u64, peers: Vec<String>, acts: &mut Vec<Action>) {
        let Phase::Deploying(d) = &mut self.phase else {
            return;
        };
        // Wall-clock milliseconds only grow across attempts and coordinators: a writer
        // of any earlier attempt (a worker that missed its heartbeats but still runs) is
        // refused once the shards are rolled back for this one, and its file sink's
        // leftovers are told apart.
        self.fence = now.max(self.fence + 1);
        if self.managed_state {
            d.step = DeployStep::OpeningState { peers };
            self.waiting_for("the state service to open the job's shards");
            acts.push(Action::OpenState);
        } else {
            self.send_deploy(now, peers, None, acts);
        }
    }

    pub(super) fn on_state_opened(
        &mut self,
        now: u64,
        r: Result<u64, Failure>,
        acts: &mut Vec<Action>,
    ) {
        let Phase::Deploying(Deploying {
            step: DeployStep::OpeningState { peers },
            ..
        }) = &mut self.phase
        else {
            return;
        };
        let peers = std::mem::take(peers);
        let held = match r {
            Ok(held) => held,
            Err(e) => {
                return self.fail_attempt(now, e.context("state service"), None, acts);
            }
        };
        if let Some(p) = self.protocol.as_mut()
            && held >= p.next_id()
        {
            // The shards hold a checkpoint the store does not know (the job's state
            // was prepared elsewhere): ids continue after it.
            p.record_existing(held, false);
        }
        let first_epoch = self.protocol.as_ref().map_or(1, |p| p.next_id());
        let mut reference = self.state_ref.clone().unwrap_or_default();
        // Writes of the attempt belong to the next checkpoint; a fresh job without a
        // coordinator checkpoint continues after what the shards hold.
        reference.first_epoch = first_epoch.max(held + 1);
        reference.fence = self.fence;
        match self.restore.as_ref().map(|m| m.checkpoint_id) {
            Some(checkpoint) => {
                self.waiting_for(&format!(
                    "the state service to roll the shards back to checkpoint {checkpoint}"
                ));
                let fence = self.fence;
                if let Phase::Deploying(d) = &mut self.phase {
                    d.step = DeployStep::RollingBack { peers, reference };
                }
                acts.push(Action::RollbackState { checkpoint, fence });
            }
            None => self.send_deploy(now, peers, Some(reference), acts),
        }
    }

    pub(super) fn on_rolled_back(
        &mut self,
        now: u64,
        r: Result<(), Failure>,
        acts: &mut Vec<Action>,
    ) {
        let Phase::Deploying(Deploying {
            step: DeployStep::RollingBack { peers, reference },
            ..
        }) = &mut self.phase
        else {
            return;
        };
        let (peers, reference) = (std::mem::take(peers), reference.clone());
        match r {
            Ok(()) => self.send_deploy(now, peers, Some(reference), acts),
            Err(e) => {
                let c = self.restore.as_ref().map_or(0, |m| m.checkpoint_id);
                let f = e.context(&format!("state rollback to checkpoint {c}"));
                self.fail_attempt(now, f, None, acts)
            }
        }
    }

    pub(super) fn send_deploy(
        &mut self,
        now: u64,
        peers: Vec<String>,
        remote_state: Option<pbc::RemoteStateRef>,
        acts: &mut Vec<Action>,
    ) {
        let settings = DeploySettings {
            job_id: self.config.job_id.clone(),
            attempt: self.attempt,
            network: self.config.network,
            metrics_interval_ms: self.config.metrics_interval_ms,
            remote_state,
            restore: self.restore.as_ref().map(control::restore),
            coordinated: self.protocol.is_some(),
            fence: self.fence,
        };
        let Phase::Deploying(d) = &mut self.phase else {
            return;
        };
        for (i, w) in d.workers.iter().enumerate() {
            acts.push(Action::Send {
                workers: vec![w.clone()],
                msg: Box::new(control::deploy(&settings, &self.graph, i, &peers)),
            });
        }
        d.step = DeployStep::Deploying {
            deployed: BTreeSet::new(),
            tasks: BTreeSet::new(),
        };
        d.deadline = now + ms(self.config.deploy_timeout);
        let n = d.workers.len();
        self.waiting_for(&format!("workers to deploy their tasks: 0 of {n}"));
    }

    /// Every worker deployed its tasks: the attempt runs.
    pub(super) fn deployed(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Phase::Deploying(d) = std::mem::replace(&mut self.phase, Phase::Created) else {
            return;
        };
        let DeployStep::Deploying { tasks, .. } = d.step else {
            self.phase = Phase::Deploying(d);
            return;
        };
        tracing::info!(job = %self.config.job_id, attempt = self.attempt, workers = d.workers.len(),
            restore = ?self.restore.as_ref().map(|m| m.checkpoint_id), "deployed");
        self.phase = Phase::Running(Running {
            workers: d.workers,
            tasks: tasks.clone(),
            reports: d.reports,
            finished: d.finished,
            ..Running::default()
        });
        self.status.waiting_for = None;
        // Counts continue from the restored checkpoint's: a record read again after a
        // restore counts once, across attempts and coordinators.
        self.records_base = self.restore.as_ref().map_or(0, |m| m.records_in);
        self.status.records_in = self.records_base;
        self.status.records_out = 0;
        self.status.tasks.clear();
        if let Some(p) = self.protocol.as_mut() {
            p.set_records_before(RecordsBefore(self.records_base));
            let aborted = p.set_tasks(now, tasks);
            p.set_periodic(true);
            self.protocol_actions(now, aborted, acts);
        }
        if self.lifecycle == JobState::Rescaling {
            self.transition(JobEvent::Rescaled);
            self.rescale_deployed(now, acts);
        } else {
            self.transition(JobEvent::Deployed);
        }
        // Tasks that finished while the others deployed, and workers that ended.
        self.maybe_final_checkpoint(now, acts);
        self.maybe_finished(now, acts);
    }
}
