//! A running attempt: worker reports and acknowledgements, the final checkpoint, lost
//! workers and time passing.

use super::*;

impl Driver {
    pub(super) fn on_worker(
        &mut self,
        now: u64,
        worker: String,
        msg: wm::Msg,
        acts: &mut Vec<Action>,
    ) {
        match &self.phase {
            Phase::Deploying(_) => self.on_deploying_message(now, worker, msg, acts),
            Phase::Running(_) => self.on_running_message(now, worker, msg, acts),
            Phase::Cancelling(c) => {
                if let wm::Msg::Report(r) = &msg
                    && r.attempt == c.attempt
                    && r.r#final
                {
                    self.cancel_confirmed(now, &worker, acts);
                }
            }
            _ => {}
        }
    }

    pub(super) fn on_running_message(
        &mut self,
        now: u64,
        worker: String,
        msg: wm::Msg,
        acts: &mut Vec<Action>,
    ) {
        let attempt = self.attempt;
        let Phase::Running(r) = &mut self.phase else {
            return;
        };
        if !r.workers.contains(&worker) {
            return;
        }
        match msg {
            wm::Msg::Report(report) if report.attempt == attempt => {
                self.on_report(now, worker, report, acts)
            }
            wm::Msg::Ack(a) if a.attempt == attempt && a.finished => {
                if let Some(t) = &a.task {
                    r.finished.insert(control::task_id(t));
                }
                self.maybe_final_checkpoint(now, acts);
            }
            wm::Msg::Ack(a) if a.attempt == attempt && a.committed => {
                if let Some(t) = &a.task {
                    let task = control::task_id(t);
                    let newest = r.committed.entry(task).or_default();
                    *newest = (*newest).max(a.checkpoint_id);
                    if let Some(s) = &mut r.stopping
                        && a.checkpoint_id >= s.id
                    {
                        s.waiting.remove(&task);
                    }
                }
                self.maybe_stopped(now, acts);
            }
            wm::Msg::Ack(a) if a.attempt == attempt => {
                let (Some(p), Some(t)) = (self.protocol.as_mut(), a.task.as_ref()) else {
                    return;
                };
                let task = control::task_id(t);
                let out = p.acknowledge(now, control::task_ack(a, task));
                self.protocol_actions(now, out, acts);
            }
            wm::Msg::SourceWatermarks(w) if w.attempt == attempt => {
                for (to, group, watermark) in r.alignment.update(&worker, &w) {
                    acts.push(Action::Send {
                        workers: vec![to],
                        msg: Box::new(cm::Msg::Align(pbc::AlignWatermarks {
                            attempt,
                            group,
                            watermark,
                        })),
                    });
                }
            }
            wm::Msg::Decline(d) if d.attempt == attempt => {
                let (Some(p), Some(t)) = (self.protocol.as_mut(), d.task.as_ref()) else {
                    return;
                };
                let out = p.decline(now, d.checkpoint_id, control::task_id(t), &d.reason);
                self.protocol_actions(now, out, acts);
            }
            // Messages of earlier attempts, late answers to deployment.
            _ => {}
        }
    }

    /// A worker's report: progress, a failure, or the end of its tasks.
    pub(super) fn on_report(
        &mut self,
        now: u64,
        worker: String,
        r: pbc::Report,
        acts: &mut Vec<Action>,
    ) {
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
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        if !r.r#final {
            if !r.tasks.is_empty() {
                let tasks = &mut self.status.tasks;
                tasks.retain(|t| t.worker != worker);
                tasks.extend(r.tasks.iter().map(|t| TaskStatus::from_report(&worker, t)));
                tasks.sort_by(|a, b| a.task.cmp(&b.task));
            }
            run.progress
                .insert(worker, (r.records_in, r.records_out, r.watermark));
            self.status.records_in =
                self.records_base + run.progress.values().map(|p| p.0).sum::<u64>();
            self.status.records_out = run.progress.values().map(|p| p.1).sum();
            self.status.watermark = run.progress.values().filter_map(|p| p.2).min();
            return;
        }
        // A worker ends its attempt once its tasks are done: after the final checkpoint,
        // or at once when it has no tasks.
        run.reports.insert(worker, r);
        self.maybe_finished(now, acts);
    }

    /// Every worker's final report is in: the job finished.
    pub(super) fn maybe_finished(&mut self, _now: u64, acts: &mut Vec<Action>) {
        let Phase::Running(run) = &self.phase else {
            return;
        };
        if run.reports.len() < run.workers.len() {
            return;
        }
        let reports: Vec<&pbc::Report> = run.reports.values().collect();
        let st = &mut self.status;
        st.records_in = self.records_base + reports.iter().map(|r| r.records_in).sum::<u64>();
        st.records_out = reports.iter().map(|r| r.records_out).sum();
        st.late = reports.iter().map(|r| r.late).sum();
        st.skipped = reports.iter().map(|r| r.skipped).sum();
        st.barriers = reports.iter().map(|r| r.barriers).sum();
        let last = reports
            .iter()
            .map(|r| r.last_flushed_epoch)
            .max()
            .unwrap_or(0);
        let stopping = match &mut self.phase {
            Phase::Running(run) => run.stopping.take(),
            _ => None,
        };
        // With checkpoints, the final checkpoint committed the shards already; without,
        // every task flushed its last epoch at the end of its input.
        if self.managed_state && self.protocol.is_none() && last > 0 {
            acts.push(Action::CommitState {
                id: last,
                retained: vec![last],
            });
        }
        if let Some(s) = stopping {
            // The job ended while a stop waited for its sinks: they committed everything.
            let answer = Answer::Stopped(StopOutcome {
                savepoint: s.path,
                warning: None,
            });
            acts.push(reply_to(s.reply, answer));
        }
        self.answer_all("the job finished", acts);
        acts.push(Action::ReleaseSlots);
        self.finish(JobEvent::AllFinished);
    }

    /// Once every task finished its input, the final checkpoint commits the last output.
    pub(super) fn maybe_final_checkpoint(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Phase::Running(run) = &self.phase else {
            return;
        };
        if self.protocol.is_none()
            || run.final_id.is_some()
            || run.tasks.is_empty()
            || !run.tasks.is_subset(&run.finished)
        {
            return;
        }
        self.answer_requests("the job reached the end of its input", acts);
        let p = self.protocol.as_mut().expect("checked above");
        p.set_periodic(false);
        let out = p.abort_all(now, AbortReason::InputEnded);
        self.protocol_actions(now, out, acts);
        self.trigger_final(now, acts);
    }

    /// Triggers the final checkpoint (again).
    pub(super) fn trigger_final(&mut self, now: u64, acts: &mut Vec<Action>) {
        let Some(p) = self.protocol.as_mut() else {
            return;
        };
        let out = p.trigger_now(now);
        if let Phase::Running(run) = &mut self.phase {
            run.final_id = triggered(&out);
            run.final_triggers += 1;
        }
        self.protocol_actions(now, out, acts);
    }

    pub(super) fn on_lost(
        &mut self,
        now: u64,
        worker: String,
        reason: String,
        acts: &mut Vec<Action>,
    ) {
        let during = match &self.phase {
            Phase::Deploying(d) if d.workers.contains(&worker) => "while deploying",
            Phase::Running(r) if r.workers.contains(&worker) => "",
            Phase::Cancelling(c) if c.waiting.contains(&worker) => {
                return self.cancel_confirmed(now, &worker, acts);
            }
            _ => return,
        };
        let reason = if during.is_empty() {
            format!("worker {worker} lost: {reason}")
        } else {
            format!("worker {worker} lost {during}: {reason}")
        };
        self.fail_attempt(now, Failure::system(reason), Some(&worker), acts);
    }

    pub(super) fn on_tick(&mut self, now: u64, acts: &mut Vec<Action>) {
        match &mut self.phase {
            Phase::Deploying(d) if now >= d.deadline => {
                let timeout = self.config.deploy_timeout;
                let reason = match &d.step {
                    DeployStep::Preparing { addresses } => {
                        let late = missing(&d.workers, |w| addresses.contains_key(w));
                        format!("workers did not bind their data ports within {timeout:?}: {late}")
                    }
                    DeployStep::Deploying { deployed, .. } => {
                        let late = missing(&d.workers, |w| deployed.contains(w));
                        format!("workers did not deploy their tasks within {timeout:?}: {late}")
                    }
                    _ => return,
                };
                self.fail_attempt(now, Failure::system(reason), None, acts);
            }
            Phase::Running(run) => {
                if let Some(s) = run.stopping.take_if(|s| now >= s.deadline) {
                    let late: Vec<String> = s.waiting.iter().map(|t| t.to_string()).collect();
                    let warning = format!(
                        "{} task(s) did not confirm committing the savepoint's output within \
                         {:?} ({}); what they did not commit becomes visible when a job \
                         resumes from the savepoint",
                        late.len(),
                        self.config.stop_commit_timeout,
                        late.join(", ")
                    );
                    tracing::warn!(job = %self.config.job_id, "{warning}");
                    return self.stopped(now, s, Some(warning), acts);
                }
                if let Some(p) = self.protocol.as_mut() {
                    let out = p.poll(now);
                    self.protocol_actions(now, out, acts);
                }
            }
            Phase::Cancelling(c) if now >= c.deadline => {
                tracing::warn!(job = %self.config.job_id, waiting = ?c.waiting,
                    "workers did not confirm the cancellation in time");
                c.waiting.clear();
                self.cancelled(now, acts);
            }
            Phase::BackingOff { until } if now >= *until => {
                self.phase = Phase::FindingRestorePoint;
                self.waiting_for("the newest valid checkpoint to be read");
                acts.push(Action::ReadLatestCheckpoint);
            }
            _ => {}
        }
    }
}
