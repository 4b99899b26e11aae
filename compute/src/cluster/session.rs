//! A worker's session with the coordinator (`sluice worker --coordinator URL`).
//!
//! The worker opens one `Attach` stream, registers, heartbeats, and runs what the
//! coordinator sends (see `common/proto/cluster.proto`): one deployment attempt at a time
//! per slot, each on a fresh data port, so connections of an old attempt can never be
//! mistaken for a new one's. Cancelling an attempt aborts its tasks and connections at
//! once (they are owned by the attempt's future) and answers with a final report. When
//! the stream breaks, running attempts are cancelled (the coordinator restarts the job
//! from its last checkpoint elsewhere) and the worker attaches again, unless told to
//! exit with its coordinator.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::StreamExt;
use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::coordinator_client::CoordinatorClient;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::checkpoint_trace::TaskTraces;
use crate::cluster::task_metrics;
use crate::cluster::worker::{AttemptEvent, AttemptLink, WorkerEnv, run_attempt};
use crate::error::{Error, Result};
use crate::runtime::alignment::Alignment;
use crate::runtime::metrics::JobMetrics;
use crate::runtime::task::CheckpointEvent;

/// How often a running attempt reports its counts.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// How often an attempt checks whether its first record was read.
const FIRST_RECORD_POLL: Duration = Duration::from_millis(10);

/// Version of the control protocol (`Register.protocol_version`).
pub use sluice_common::pb::cluster::PROTOCOL_VERSION;

/// How a worker finds and serves its coordinator.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// `http://host:port` of the coordinator's gRPC API; several, comma-separated,
    /// for coordinators electing a leader.
    pub coordinator: String,
    /// Host to bind data ports on and to advertise.
    pub host: String,
    /// Deployments run at once.
    pub slots: u32,
    /// A name for messages.
    pub name: String,
    /// Exit when the coordinator goes away instead of attaching again (workers that an
    /// embedded coordinator started).
    pub exit_with_coordinator: bool,
    /// What the worker offers jobs: connectors, and the memory state it shares with a
    /// coordinator in the same process.
    pub env: WorkerEnv,
}

/// Serves the coordinator until it goes away for good (with `exit_with_coordinator`),
/// attaching again after every broken stream otherwise.
pub async fn serve(options: SessionOptions) -> Result<()> {
    // Several coordinators (`URL1,URL2`: a leader and standbys) are tried in turn; a
    // standby refuses, naming the leader.
    let urls = sluice_common::url_list::url_list(&options.coordinator);
    if urls.is_empty() {
        return Err(Error::Plan(format!(
            "no coordinator address in `{}`",
            options.coordinator
        )));
    }
    let first = Duration::from_millis(200);
    let mut delay = first;
    loop {
        for url in &urls {
            let attached = std::time::Instant::now();
            match attach(&options, url).await {
                Ok(()) => tracing::warn!("the coordinator at {url} closed the control stream"),
                // A standby says so on every turn until it leads: not worth a warning.
                Err(e) if e.to_string().contains("is a standby") => {
                    tracing::debug!("control stream: {e}");
                }
                Err(e) if sluice_common::tls::is_certificate_error(&e.to_string()) => {
                    return Err(Error::Plan(format!(
                        "the coordinator at {url} and this worker do not accept each \
                         other's certificates: {e}"
                    )));
                }
                Err(e) => tracing::warn!("control stream: {e}"),
            }
            if options.exit_with_coordinator {
                return Err(Error::Internal(format!("lost the coordinator at {url}")));
            }
            // After a session that lasted, the next coordinator is tried at once: it is
            // a standby taking over, or this one restarting.
            if attached.elapsed() > Duration::from_secs(5) {
                delay = first;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// A running attempt.
struct Attempt {
    triggers: mpsc::UnboundedSender<(u64, bool, bool)>,
    /// Its aligned sources, which the coordinator's group minimums reach.
    alignment: Arc<Alignment>,
    /// The checkpoint spans its tasks' acknowledgements are traced under.
    traces: Arc<TaskTraces>,
    completed: watch::Sender<u64>,
    /// The attempt's task, aborted when the attempt is dropped.
    _handle: AbortOnDropHandle<()>,
}

/// One attached session; returns when the stream ends.
async fn attach(options: &SessionOptions, url: &str) -> Result<()> {
    let channel = sluice_common::tls::endpoint(url)
        .map_err(|e| Error::Plan(format!("coordinator address: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| {
            Error::Internal(format!(
                "cannot reach the coordinator at {url}: {}",
                sluice_common::tls::with_causes(&e)
            ))
        })?;
    let (out_tx, out_rx) = mpsc::unbounded_channel::<pbc::WorkerMessage>();
    let send = move |tx: &mpsc::UnboundedSender<pbc::WorkerMessage>, msg: wm::Msg| {
        let _ = tx.send(pbc::WorkerMessage { msg: Some(msg) });
    };
    send(
        &out_tx,
        wm::Msg::Register(pbc::Register {
            protocol_version: PROTOCOL_VERSION,
            pid: std::process::id(),
            host: options.host.clone(),
            slots: options.slots.max(1),
            name: options.name.clone(),
        }),
    );
    let outbound =
        futures::stream::unfold(
            out_rx,
            |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
        );
    let mut inbound = CoordinatorClient::new(channel)
        .max_decoding_message_size(sluice_common::MAX_CONTROL_MESSAGE_BYTES)
        .max_encoding_message_size(sluice_common::MAX_CONTROL_MESSAGE_BYTES)
        .attach(outbound)
        .await
        .map_err(|s| Error::Internal(format!("attach refused: {}", s.message())))?
        .into_inner();
    let first = inbound
        .next()
        .await
        .ok_or_else(|| Error::Internal("the coordinator closed before registering us".into()))?
        .map_err(|s| Error::Internal(format!("registration refused: {}", s.message())))?;
    let Some(cm::Msg::Registered(registered)) = first.msg else {
        return Err(Error::Internal(
            "the coordinator's first message was not `registered`".into(),
        ));
    };
    tracing::info!("registered with {url} as {}", registered.worker_id);
    let mut heartbeat = tokio::time::interval(Duration::from_millis(
        registered.heartbeat_interval_ms.clamp(50, 10_000),
    ));
    let mut prepared: HashMap<u64, TcpListener> = HashMap::new();
    let mut running: HashMap<u64, Attempt> = HashMap::new();
    // Attempts report here when they end by themselves.
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<u64>();
    loop {
        tokio::select! {
            _ = heartbeat.tick() => send(&out_tx, wm::Msg::Heartbeat(pbc::Heartbeat {
                rss_bytes: task_metrics::rss_bytes(),
            })),
            Some(attempt) = done_rx.recv() => {
                running.remove(&attempt);
            }
            message = inbound.next() => {
                let msg = match message {
                    None => return Ok(()),
                    Some(Err(s)) => return Err(Error::Internal(format!("control stream broke: {}", s.message()))),
                    Some(Ok(m)) => m.msg,
                };
                match msg {
                    Some(cm::Msg::Prepare(p)) => {
                        let bound = TcpListener::bind((options.host.as_str(), 0)).await;
                        let (data_address, error) = match bound.and_then(|l| {
                            let a = l.local_addr()?;
                            prepared.insert(p.attempt, l);
                            Ok(a)
                        }) {
                            Ok(a) => (a.to_string(), String::new()),
                            Err(e) => (String::new(), format!("cannot bind a data port on {}: {e}", options.host)),
                        };
                        send(&out_tx, wm::Msg::Prepared(pbc::Prepared { attempt: p.attempt, data_address, error }));
                    }
                    Some(cm::Msg::Deploy(d)) => {
                        let Some(listener) = prepared.remove(&d.attempt) else {
                            send(&out_tx, wm::Msg::Deployed(pbc::Deployed {
                                attempt: d.attempt,
                                error: format!("attempt {} was not prepared", d.attempt),
                                ..Default::default()
                            }));
                            continue;
                        };
                        let Some(deployment) = d.deployment else { continue };
                        let attempt = start_attempt(d.attempt, listener, deployment, options.env.clone(), out_tx.clone(), done_tx.clone());
                        running.insert(d.attempt, attempt);
                    }
                    Some(cm::Msg::Trigger(t)) => {
                        if let Some(a) = running.get(&t.attempt) {
                            a.traces.triggered(t.checkpoint_id, &t.trace_parent);
                            let _ = a.triggers.send((t.checkpoint_id, t.unaligned, t.final_checkpoint));
                        }
                    }
                    Some(cm::Msg::Complete(c)) => {
                        if let Some(a) = running.get(&c.attempt) {
                            a.traces.completed(c.checkpoint_id);
                            a.completed.send_if_modified(|v| {
                                let newer = c.checkpoint_id > *v;
                                if newer { *v = c.checkpoint_id; }
                                newer
                            });
                        }
                    }
                    Some(cm::Msg::Abort(_)) => {
                        // Nothing prepared for a checkpoint outlives it: the state
                        // service drops epochs on rollback, sinks discard on recovery.
                    }
                    Some(cm::Msg::Cancel(c)) => {
                        prepared.remove(&c.attempt);
                        if running.remove(&c.attempt).is_some() {
                            tracing::info!("attempt {} cancelled", c.attempt);
                        }
                        send(&out_tx, wm::Msg::Report(pbc::Report {
                            attempt: c.attempt,
                            r#final: true,
                            cancelled: true,
                            ..Default::default()
                        }));
                    }
                    Some(cm::Msg::Align(a)) => {
                        if let Some(run) = running.get(&a.attempt) {
                            run.alignment.announce(&a.group, a.watermark);
                        }
                    }
                    Some(cm::Msg::Registered(_)) | None => {}
                }
            }
        }
    }
}

/// Spawns attempt `attempt`; its events and final report go to `out`.
fn start_attempt(
    attempt: u64,
    listener: TcpListener,
    deployment: pbc::Deployment,
    env: WorkerEnv,
    out: mpsc::UnboundedSender<pbc::WorkerMessage>,
    done: mpsc::UnboundedSender<u64>,
) -> Attempt {
    let (triggers_tx, triggers_rx) = mpsc::unbounded_channel();
    let (completed_tx, completed_rx) = watch::channel(0u64);
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let metrics = Arc::new(JobMetrics::default());
    let alignment = Arc::new(Alignment::default());
    let traces = Arc::new(TaskTraces::default());
    let link = AttemptLink {
        triggers: triggers_rx,
        completed: completed_rx,
        events: events_tx,
        metrics: metrics.clone(),
        alignment: alignment.clone(),
        traces: traces.clone(),
    };
    let acks = traces.clone();
    let alignment_out = alignment.clone();
    let handle = tokio::spawn(async move {
        let forward_out = out.clone();
        let forward = async move {
            while let Some(event) = events_rx.recv().await {
                let msg = attempt_message(attempt, event);
                if let wm::Msg::Ack(ack) = &msg {
                    acks.acked(ack);
                }
                let _ = forward_out.send(pbc::WorkerMessage { msg: Some(msg) });
            }
        };
        let progress_out = out.clone();
        let progress = async move {
            // Counts so far, for `sluice status` while the job runs: at once when the
            // first record was read (how recovery time is measured), then every second;
            // with each task's rates over the last interval (a sampler of its own, so
            // the metrics lines keep their interval), once the tasks are deployed.
            let mut sampler: Option<task_metrics::Sampler> = None;
            let mut report = || {
                if sampler.is_none() {
                    let tasks = metrics
                        .tasks
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    if !tasks.is_empty() {
                        sampler = Some(task_metrics::Sampler::new(tasks, Default::default()));
                    }
                }
                let report = pbc::Report {
                    attempt,
                    records_in: metrics.records_in.load(Ordering::Relaxed),
                    records_out: metrics.records_out.load(Ordering::Relaxed),
                    watermark: metrics.watermark(),
                    rss_bytes: task_metrics::rss_bytes(),
                    tasks: sampler.as_mut().map(|s| s.sample()).unwrap_or_default(),
                    ..Default::default()
                };
                let _ = progress_out.send(pbc::WorkerMessage {
                    msg: Some(wm::Msg::Report(report)),
                });
            };
            let mut poll = tokio::time::interval(FIRST_RECORD_POLL);
            let mut last = tokio::time::Instant::now();
            while metrics.records_in.load(Ordering::Relaxed) == 0 {
                poll.tick().await;
                if last.elapsed() >= PROGRESS_INTERVAL {
                    last = tokio::time::Instant::now();
                    report();
                }
            }
            let mut every_second = tokio::time::interval(PROGRESS_INTERVAL);
            loop {
                // The first tick is at once: the first record's report.
                every_second.tick().await;
                report();
            }
        };
        let aligning = report_watermarks(attempt, alignment_out, out.clone());
        let run = async move {
            tokio::select! {
                report = run_attempt(&listener, deployment, Some(link), env) => report,
                () = progress => unreachable!("the progress loop never ends"),
                () = aligning => unreachable!("the alignment loop never ends"),
            }
        };
        // The forwarder ends when the attempt drops its last event sender.
        let (mut report, ()) = tokio::join!(run, forward);
        report.attempt = attempt;
        let _ = out.send(pbc::WorkerMessage {
            msg: Some(wm::Msg::Report(report)),
        });
        let _ = done.send(attempt);
    });
    Attempt {
        alignment,
        traces,
        triggers: triggers_tx,
        completed: completed_tx,
        _handle: AbortOnDropHandle::new(handle),
    }
}

/// Sends the watermarks of the attempt's aligned sources to the coordinator every
/// update interval; never ends.
async fn report_watermarks(
    attempt: u64,
    alignment: Arc<Alignment>,
    out: mpsc::UnboundedSender<pbc::WorkerMessage>,
) {
    // Reports sent early (a task paused, or moved half its drift) come at most this often.
    const EARLY: Duration = Duration::from_millis(5);
    let mut last = tokio::time::Instant::now();
    loop {
        let Some(every) = alignment.update_interval() else {
            // Nothing to say until a task is aligned (never, in most jobs): the first
            // to join wakes this.
            alignment.due().await;
            continue;
        };
        tokio::select! {
            () = tokio::time::sleep_until(last + every) => {}
            () = alignment.due() => tokio::time::sleep_until(last + EARLY).await,
        }
        last = tokio::time::Instant::now();
        let Some(tasks) = alignment.report() else {
            continue;
        };
        let tasks = tasks
            .into_iter()
            .map(|(task, group, watermark)| pbc::SourceWatermark {
                task: Some(task_ref(task, true)),
                group,
                watermark,
            })
            .collect();
        let msg = wm::Msg::SourceWatermarks(pbc::SourceWatermarks { attempt, tasks });
        let _ = out.send(pbc::WorkerMessage { msg: Some(msg) });
    }
}

fn task_ref((node, subtask): (u32, u32), source: bool) -> pbc::TaskRef {
    pbc::TaskRef {
        node,
        subtask,
        source,
    }
}

/// The control message of an attempt's event.
fn attempt_message(attempt: u64, event: AttemptEvent) -> wm::Msg {
    match event {
        AttemptEvent::Deployed(tasks) => wm::Msg::Deployed(pbc::Deployed {
            attempt,
            tasks: tasks
                .into_iter()
                .map(|(n, s, source)| task_ref((n, s), source))
                .collect(),
            error: String::new(),
            user_error: false,
            unavailable: false,
        }),
        AttemptEvent::Checkpoint(CheckpointEvent::Ack {
            checkpoint_id,
            task,
            positions,
            sink_states,
            sync_micros,
            alignment_micros,
            source_records,
            channel_state,
        }) => wm::Msg::Ack(pbc::CheckpointAck {
            attempt,
            checkpoint_id,
            task: Some(task_ref(task, !positions.is_empty())),
            // Sinks' states travel (and are restored) as splits of their own names.
            source_positions: positions
                .into_iter()
                .chain(sink_states)
                .map(|(split, position)| pbc::SourcePosition { split, position })
                .collect(),
            shard_handles: Vec::new(),
            sync_micros,
            alignment_micros,
            source_records,
            channel_state: channel_state.unwrap_or_default(),
            ..Default::default()
        }),
        AttemptEvent::Checkpoint(CheckpointEvent::Finished { task }) => {
            wm::Msg::Ack(pbc::CheckpointAck {
                attempt,
                task: Some(task_ref(task, false)),
                finished: true,
                ..Default::default()
            })
        }
        AttemptEvent::Checkpoint(CheckpointEvent::Committed {
            checkpoint_id,
            task,
        }) => wm::Msg::Ack(pbc::CheckpointAck {
            attempt,
            checkpoint_id,
            task: Some(task_ref(task, false)),
            committed: true,
            ..Default::default()
        }),
        AttemptEvent::Checkpoint(CheckpointEvent::Decline {
            checkpoint_id,
            task,
            reason,
        }) => wm::Msg::Decline(pbc::CheckpointDecline {
            attempt,
            checkpoint_id,
            task: Some(task_ref(task, false)),
            reason,
        }),
    }
}
