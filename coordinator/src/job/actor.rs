//! A job's actor: the one mailbox loop where the job's I/O happens.
//!
//! [`JobActor`] owns the job's [`Driver`] and everything the driver must not touch: the
//! worker registry (slots, control streams), the `_metadata` store, the state service
//! (through [`StateStore`]), the worker launcher, the answer channels of user
//! commands, and the published status. Its loop waits (biased) on user commands, the
//! workers' events, free slots when it waits for some, and the driver's next deadline;
//! hands what happened to the driver; and carries out the [`Action`]s it returns in
//! order, feeding each result back as an event at once. It decides nothing: a question
//! about the job's life goes to the driver.
//!
//! It knows the registry only through its public API and routes nothing: worker
//! messages arrive on the channel the registry was given for this job.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{mpsc, watch};

use super::command::{Command, ReplyId, Responder};
use super::driver::{Action, Driver, End, Event, Failure};
use super::lifecycle::JobState;
use super::ports::{StateConnector, StateStore, WorkerLauncher};
use super::status::{FailureRecord, JobStatus};
use super::trace::LifecycleTraces;
use crate::checkpoint::metadata::{self, CheckpointMetadata};
use crate::checkpoint::store::{self, CreateOutcome, MetadataStore};
use crate::checkpoint::trace::CheckpointTraces;
use crate::cluster::registry::{Registry, WorkerEvent, WorkerHandle};
use crate::cluster::state_nodes::StateNodes;
use opentelemetry::context::FutureExt as _;
use sluice_common::state::PlacementHints;
use sluice_telemetry::trace;

/// How often a job waiting for slots looks again even without news from the registry.
const SLOT_POLL: Duration = Duration::from_millis(200);

/// Wall-clock milliseconds since the Unix epoch: the driver's time.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// What the actor reaches the world through.
pub(crate) struct Ports {
    pub registry: Arc<Registry>,
    pub store: Arc<dyn MetadataStore>,
    pub state_connector: Option<Arc<dyn StateConnector>>,
    /// The registered state nodes, over which the connector places shards.
    pub state_nodes: Arc<StateNodes>,
    pub launcher: Option<Arc<dyn WorkerLauncher>>,
    /// Whose shards in the state service the job uses.
    pub state_id: String,
}

/// One job's actor: see the module docs.
pub(crate) struct JobActor {
    id: String,
    driver: Driver,
    ports: Ports,
    commands: mpsc::UnboundedReceiver<Command>,
    events: mpsc::UnboundedReceiver<WorkerEvent>,
    status: watch::Sender<JobStatus>,
    published: u64,
    shards: Option<Arc<dyn StateStore>>,
    /// The job's slots, by worker.
    workers: HashMap<String, WorkerHandle>,
    /// Slots wanted and not held yet.
    wanted: Option<usize>,
    /// Workers free for the job when last told to the driver.
    told_free: Option<usize>,
    replies: HashMap<ReplyId, Responder>,
    next_reply: u64,
    /// The open checkpoints' spans.
    traces: CheckpointTraces,
    /// The newest failure written to the store, as (time, attempt).
    persisted_failure: Option<(u64, u64)>,
    /// The trace of a deploy, failover or rescale under way.
    lifecycle: LifecycleTraces,
}

impl JobActor {
    /// The actor of `driver`'s job `id`.
    pub(crate) fn new(
        id: String,
        driver: Driver,
        ports: Ports,
        commands: mpsc::UnboundedReceiver<Command>,
        events: mpsc::UnboundedReceiver<WorkerEvent>,
        status: watch::Sender<JobStatus>,
    ) -> Self {
        Self {
            id,
            driver,
            ports,
            commands,
            events,
            status,
            published: 0,
            shards: None,
            workers: HashMap::new(),
            wanted: None,
            told_free: None,
            replies: HashMap::new(),
            next_reply: 0,
            traces: CheckpointTraces::default(),
            persisted_failure: None,
            lifecycle: LifecycleTraces::default(),
        }
    }

    /// Runs the job to its end; returns how it ended.
    pub(crate) async fn run(mut self) -> JobState {
        let first = self.driver.start(now_ms());
        self.execute(first).await;
        let (mut commands_open, mut events_open) = (true, true);
        let end = loop {
            if let Some(end) = self.driver.end() {
                break end;
            }
            let deadline = self.driver.next_deadline().map(|at| {
                let wait = at.saturating_sub(now_ms());
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            let event = tokio::select! {
                biased;
                command = self.commands.recv(), if commands_open => match command {
                    Some(c) => Some(self.request(c)),
                    None => {
                        // Nobody can ask anything any more; the job goes on.
                        commands_open = false;
                        None
                    }
                },
                event = self.events.recv(), if events_open => match event {
                    Some(WorkerEvent::Message { worker, msg }) => Some(Event::Worker { worker, msg }),
                    Some(WorkerEvent::Lost { worker, reason }) => Some(Event::WorkerLost { worker, reason }),
                    None => {
                        // Cannot happen while the registry holds the job (this actor
                        // holds the registry); deadlines still apply.
                        events_open = false;
                        None
                    }
                },
                () = self.ports.registry.wait_for_change(SLOT_POLL), if self.wanted.is_some() => {
                    self.try_acquire()
                }
                () = sleep_until(deadline) => Some(Event::Tick),
            };
            if let Some(event) = event {
                let actions = self.driver.on_event(now_ms(), event);
                self.execute(actions).await;
            }
        };
        self.finish(end).await;
        end.state
    }

    /// Registers `c`'s answer channel; the request for the driver.
    fn request(&mut self, c: Command) -> Event {
        let (request, responder) = c.split();
        self.next_reply += 1;
        let reply = ReplyId(self.next_reply);
        self.replies.insert(reply, responder);
        Event::Request { reply, request }
    }

    /// Cleans up after the end: slots, the registry's channel, the end marker.
    async fn finish(&mut self, end: End) {
        self.ports.registry.remove_job(&self.id);
        self.workers.clear();
        for (_, r) in self.replies.drain() {
            r.send(Err("the job has ended".into()));
        }
        self.publish(true);
        if end.record {
            let marker = format!("jobs/{}/end", self.id);
            if let Err(e) = self
                .ports
                .store
                .create_if_absent(&marker, Bytes::from(end.state.to_string()))
                .await
            {
                tracing::warn!(job = %self.id, "cannot record the job's end: {e}");
            }
        }
    }

    /// Publishes the driver's status when it changed.
    fn publish(&mut self, force: bool) {
        let version = self.driver.status_version();
        if force || version != self.published {
            self.published = version;
            // Most events (a checkpoint's thousands of acknowledgements) change nothing
            // shown: comparing in place costs no allocation, a copy of the whole status
            // per event did (half the coordinator's CPU at 5,000 subtasks).
            let status = self.driver.status();
            self.status.send_if_modified(|published| {
                if force || published != status {
                    published.clone_from(status);
                    true
                } else {
                    false
                }
            });
        }
    }

    /// Carries out `actions` in order, and those their results lead to.
    async fn execute(&mut self, actions: Vec<Action>) {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            // The I/O an action does is traced under the phase the job is in.
            self.lifecycle.observe(self.driver.status());
            if let Some(event) = self.perform(action).await {
                queue.extend(self.driver.on_event(now_ms(), event));
            }
        }
        self.lifecycle.observe(self.driver.status());
        self.publish(false);
        self.persist_failures().await;
    }

    /// Writes the failures recorded since the last call to the store, so that a
    /// coordinator resuming the job shows its history.
    async fn persist_failures(&mut self) {
        let new: Vec<FailureRecord> = self
            .driver
            .status()
            .failures
            .iter()
            .filter(|f| Some((f.at_ms, f.attempt)) > self.persisted_failure)
            .cloned()
            .collect();
        for f in new {
            self.persisted_failure = Some((f.at_ms, f.attempt));
            let path = store::failure_path(&self.id, f.at_ms, f.attempt);
            let written = match serde_json::to_vec(&f) {
                Ok(json) => self
                    .ports
                    .store
                    .create_if_absent(&path, Bytes::from(json))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = written {
                tracing::warn!(job = %self.id, "cannot record a failure in the job's history: {e}");
            }
        }
    }

    /// Carries out one action; the event that answers it, if any.
    async fn perform(&mut self, action: Action) -> Option<Event> {
        match action {
            Action::ConnectState => Some(Event::StateConnected(self.connect().await)),
            Action::AcquireSlots { workers } => {
                self.wanted = Some(workers);
                self.told_free = None;
                self.try_acquire()
            }
            Action::ReleaseSlots => {
                self.wanted = None;
                self.workers.clear();
                self.ports.registry.release(&self.id);
                None
            }
            Action::Send { workers, mut msg } => {
                self.traces
                    .on_send(&self.id, &mut msg, self.shards.is_none());
                for w in &workers {
                    match self.workers.get(w) {
                        Some(h) => {
                            // A broken stream is reported as a lost worker by the registry.
                            h.send((*msg).clone());
                        }
                        None => {
                            tracing::debug!(job = %self.id, worker = %w, "no slot on this worker: message dropped")
                        }
                    }
                }
                None
            }
            Action::OpenState => {
                let span = self.lifecycle.child("open state");
                let opened = match &self.shards {
                    Some(s) => s.open().await.map_err(state_failure),
                    None => Err(Failure::system("the job has no state connection")),
                };
                end_span(span, opened.as_ref().err().map(|f| &f.reason));
                Some(Event::StateOpened(opened))
            }
            Action::RollbackState { checkpoint, fence } => {
                let span = self.lifecycle.child("roll back state");
                if let Some(cx) = &span {
                    trace::set_attribute(
                        cx,
                        opentelemetry::KeyValue::new("sluice.checkpoint_id", checkpoint as i64),
                    );
                }
                let rolled = match &self.shards {
                    Some(s) => s
                        .restore(checkpoint, fence)
                        .await
                        .map(|_| ())
                        .map_err(state_failure),
                    None => Err(Failure::system("the job has no state connection")),
                };
                end_span(span, rolled.as_ref().err().map(|f| &f.reason));
                Some(Event::StateRolledBack(rolled))
            }
            Action::CommitState { id, retained } => {
                let span = self.traces.child(id, "commit shards");
                let result = match &self.shards {
                    // The state client passes the span on to the state nodes.
                    Some(s) => match &span {
                        Some(cx) => s.commit(id, &retained).with_context(cx.clone()).await,
                        None => s.commit(id, &retained).await,
                    }
                    .map_err(|e| e.to_string()),
                    None => Ok(()),
                };
                if let Some(cx) = span {
                    trace::end(&cx, None, result.as_ref().err().cloned());
                }
                self.traces.finish(id, result.as_ref().err().cloned());
                Some(Event::StateCommitted { id, result })
            }
            Action::ReadRestoreBytes => Some(Event::RestoreBytes(match &self.shards {
                Some(s) => s.restored_bytes().await.unwrap_or(0),
                None => 0,
            })),
            Action::ReadLatestCheckpoint => {
                let span = self.lifecycle.child("find restore point");
                let latest = match store::latest_valid(self.ports.store.as_ref(), &self.id).await {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(job = %self.id, "cannot read checkpoints: {e}");
                        None
                    }
                };
                if let (Some(cx), Some(m)) = (&span, &latest) {
                    trace::set_attribute(
                        cx,
                        opentelemetry::KeyValue::new(
                            "sluice.checkpoint_id",
                            m.checkpoint_id as i64,
                        ),
                    );
                }
                end_span(span, None);
                Some(Event::LatestCheckpoint(latest.map(Box::new)))
            }
            Action::WriteMetadata { path, metadata } => {
                let span = self.traces.child(metadata.checkpoint_id, "write _metadata");
                // The channel state first: `_metadata` names a complete checkpoint.
                let outcome = match self.write_channel_state(&metadata).await {
                    Ok(()) => self
                        .ports
                        .store
                        .create_if_absent(&path, metadata::encode(&metadata))
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                if let Some(cx) = span {
                    trace::set_attribute(&cx, opentelemetry::KeyValue::new("path", path.clone()));
                    trace::end(&cx, None, outcome.as_ref().err().cloned());
                }
                Some(Event::MetadataWritten { path, outcome })
            }
            Action::DeleteCheckpoint { id } => {
                // Its state versions go with the shards' next commit.
                let deleted = store::delete_checkpoint(self.ports.store.as_ref(), &self.id, id)
                    .await
                    .map_err(|e| e.to_string());
                if let Err(e) = deleted {
                    tracing::warn!(job = %self.id, id, "cannot delete a checkpoint retention let go: {e}");
                }
                None
            }
            Action::Reply { to, answer } => {
                match self.replies.remove(&to) {
                    Some(r) => r.send(answer),
                    None => tracing::error!(job = %self.id, ?to, "an answer to no request"),
                }
                None
            }
        }
    }

    /// The state service's shards of the job, and the reference for its workers.
    /// Writes the channel state `metadata`'s tasks sent (an unaligned checkpoint) to the
    /// paths it references.
    async fn write_channel_state(&self, metadata: &CheckpointMetadata) -> Result<(), String> {
        for task in &metadata.tasks {
            let (Some(path), Some(object)) =
                (task.channel_state_handles.first(), &task.channel_state)
            else {
                continue;
            };
            match self
                .ports
                .store
                .create_if_absent(path, object.clone())
                .await
            {
                Ok(CreateOutcome::Created) => {}
                Ok(CreateOutcome::AlreadyExists) => {
                    return Err(format!("writing {path}: another object is there"));
                }
                Err(e) => return Err(format!("writing {path}: {e}")),
            }
        }
        Ok(())
    }

    async fn connect(&mut self) -> Result<sluice_common::pb::cluster::RemoteStateRef, Failure> {
        let Some(connector) = self.ports.state_connector.clone() else {
            return Err(Failure {
                reason: "the job keeps its state in a state service, and this coordinator \
                         knows none (--state-service)"
                    .into(),
                user: true,
                unavailable: false,
            });
        };
        let hints = PlacementHints {
            nodes: self.ports.state_nodes.live(),
            previous: self.driver.placement(),
            balance: self.driver.balancing(),
        };
        let shards = connector
            .connect(&self.ports.state_id, self.driver.graph(), &hints)
            .await
            .map_err(|e| state_failure(e).context("state service"))?
            .ok_or_else(|| Failure {
                reason: "the job's keyed state is kept where this coordinator has no \
                         connection to (start it with --state-service for remote state)"
                    .into(),
                user: true,
                unavailable: false,
            })?;
        let reference = shards.reference();
        self.shards = Some(shards);
        Ok(reference)
    }

    /// Tries to take the slots wanted; the event saying how it went, if it is news.
    fn try_acquire(&mut self) -> Option<Event> {
        let n = self.wanted?;
        if let Some(l) = &self.ports.launcher {
            l.ensure(n);
        }
        match self.ports.registry.acquire(&self.id, n) {
            Some(handles) => {
                self.wanted = None;
                let ids = handles.iter().map(|h| h.id.clone()).collect();
                self.workers = handles.into_iter().map(|h| (h.id.clone(), h)).collect();
                Some(Event::SlotsAcquired(ids))
            }
            None => {
                let free = self.ports.registry.free_for(&self.id);
                (self.told_free != Some(free)).then(|| {
                    self.told_free = Some(free);
                    Event::Capacity { free }
                })
            }
        }
    }
}

/// A state store's error as a failure: an unreachable service is waited for.
fn state_failure(e: sluice_common::state::StateError) -> Failure {
    match e {
        sluice_common::state::StateError::Unavailable(_) => Failure::unavailable(e.to_string()),
        e => Failure::system(e.to_string()),
    }
}

/// Ends `span` (if traced), failed with `error`.
fn end_span(span: Option<opentelemetry::Context>, error: Option<&String>) {
    if let Some(cx) = span {
        trace::end(&cx, None, error.cloned());
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
