//! One test per interleaving of a job's life. A small harness plays the actor: it
//! answers the state service's and the store's actions at once (unless a test holds
//! them back) and records everything else (messages to workers, slots, replies), so a
//! test reads as what happens and what the driver does about it. After every event the
//! harness checks that the lifecycle refused no transition.

use std::collections::BTreeMap;

use sluice_common::pb::cluster::worker_message as wm;

use super::*;
use crate::checkpoint::store::{checkpoint_path, savepoint_path};
use crate::job::status::FAILURE_HISTORY;

const T0: u64 = 1_000_000;
const INTERVAL: u64 = 100;
const BACKOFF: u64 = 50;
const DEPLOY_TIMEOUT: u64 = 1_000;

/// A graph of two nodes at `parallelism` (a source and a sink chained: one task each
/// per subtask), with checkpoints every 100 ms when `checkpoints`, on remote state when
/// `remote`.
fn graph(parallelism: u32, checkpoints: bool, remote: bool) -> pb::JobGraph {
    let node = |id: u32, name: &str| pb::Node {
        id,
        name: name.into(),
        parallelism,
        ..Default::default()
    };
    pb::JobGraph {
        name: "q".into(),
        max_parallelism: 128,
        nodes: vec![node(1, "source"), node(2, "sink")],
        checkpoint: checkpoints.then_some(pb::CheckpointConfig {
            interval_ms: INTERVAL,
            mode: 0,
            timeout_ms: 0,
            aligned_timeout_ms: 0,
        }),
        state: remote.then_some(pb::StateConfig {
            backend: pb::StateBackend::Remote as i32,
            shards: 4,
            cache_bytes: 0,
        }),
        ..Default::default()
    }
}

fn config(workers: usize) -> DriverConfig {
    DriverConfig {
        job_id: "q-1".into(),
        coordinator_id: "c1".into(),
        workers,
        restart: RestartPolicy {
            max_restarts: 2,
            initial_backoff: Duration::from_millis(BACKOFF),
            max_backoff: Duration::from_millis(BACKOFF * 4),
        },
        deploy_timeout: Duration::from_millis(DEPLOY_TIMEOUT),
        cancel_timeout: Duration::from_millis(500),
        stop_commit_timeout: Duration::from_millis(700),
        network: pbc::NetworkConfig::default(),
        metrics_interval_ms: 0,
        in_process_state: false,
    }
}

/// Which I/O the harness does not answer by itself.
#[derive(Default)]
struct Hold {
    rollback: bool,
    commit: bool,
    /// `ConnectState`s answered with an unavailable state service.
    unavailable_connects: u32,
}

/// The driver with a pretend actor around it.
struct H {
    d: Driver,
    now: u64,
    next_reply: u64,
    /// The pretend store: `_metadata` objects by path.
    store: BTreeMap<String, CheckpointMetadata>,
    hold: Hold,
    /// I/O held back, to be answered by the test.
    held: Vec<Action>,
    /// The placement the driver had at each `ConnectState`.
    placements_asked: Vec<Vec<(std::ops::Range<u32>, String)>>,
}

impl H {
    fn new(workers: usize, graph: pb::JobGraph) -> (Self, Vec<Action>) {
        Self::resume(workers, graph, None, 1, BTreeMap::new())
    }

    fn resume(
        workers: usize,
        graph: pb::JobGraph,
        resume: Option<CheckpointMetadata>,
        first_checkpoint_id: u64,
        store: BTreeMap<String, CheckpointMetadata>,
    ) -> (Self, Vec<Action>) {
        let d = Driver::new(Setup {
            config: config(workers),
            graph,
            resume,
            first_checkpoint_id,
            now: T0,
            history: JobHistory::default(),
        });
        let mut h = Self {
            d,
            now: T0,
            next_reply: 0,
            store,
            hold: Hold::default(),
            held: Vec::new(),
            placements_asked: Vec::new(),
        };
        let first = h.d.start(T0);
        let acts = h.run(first);
        (h, acts)
    }

    /// Feeds `event`; returns every action it led to (I/O answered on the way).
    fn feed(&mut self, event: Event) -> Vec<Action> {
        let acts = self.d.on_event(self.now, event);
        self.check();
        self.run(acts)
    }

    fn check(&self) {
        assert!(
            self.d.illegal_transitions().is_empty(),
            "illegal transitions: {:?}",
            self.d.illegal_transitions()
        );
    }

    /// Answers the I/O among `acts` (and what that leads to), returning all actions.
    fn run(&mut self, acts: Vec<Action>) -> Vec<Action> {
        let mut queue: std::collections::VecDeque<Action> = acts.into();
        let mut all = Vec::new();
        while let Some(a) = queue.pop_front() {
            let event = match &a {
                Action::ConnectState if self.hold.unavailable_connects > 0 => {
                    self.hold.unavailable_connects -= 1;
                    Some(Event::StateConnected(Err(Failure::unavailable(
                        "state service: no state node is registered with the coordinator",
                    ))))
                }
                Action::ConnectState => {
                    self.placements_asked.push(self.d.placement());
                    Some(Event::StateConnected(Ok(pbc::RemoteStateRef {
                        endpoint: "http://state".into(),
                        job_id: "q-1".into(),
                        shards: 2,
                        placement: [(0, 64, "http://s1"), (64, 128, "http://s2")]
                            .map(|(start, end, node)| pbc::ShardPlacement {
                                key_group_start: start,
                                key_group_end: end,
                                endpoint: node.into(),
                            })
                            .to_vec(),
                        ..Default::default()
                    })))
                }
                Action::OpenState => Some(Event::StateOpened(Ok(0))),
                Action::RollbackState { .. } if self.hold.rollback => {
                    self.held.push(a.clone());
                    None
                }
                Action::RollbackState { .. } => Some(Event::StateRolledBack(Ok(()))),
                Action::CommitState { .. } if self.hold.commit => {
                    self.held.push(a.clone());
                    None
                }
                Action::CommitState { id, .. } => Some(Event::StateCommitted {
                    id: *id,
                    result: Ok(()),
                }),
                Action::ReadRestoreBytes => Some(Event::RestoreBytes(0)),
                Action::ReadLatestCheckpoint => {
                    let latest = self
                        .store
                        .iter()
                        .filter(|(p, _)| p.contains("/checkpoints/"))
                        .map(|(_, m)| m.clone())
                        .max_by_key(|m| m.checkpoint_id);
                    Some(Event::LatestCheckpoint(latest.map(Box::new)))
                }
                Action::WriteMetadata { path, metadata } => {
                    let outcome = if self.store.contains_key(path) {
                        CreateOutcome::AlreadyExists
                    } else {
                        self.store.insert(path.clone(), (**metadata).clone());
                        CreateOutcome::Created
                    };
                    Some(Event::MetadataWritten {
                        path: path.clone(),
                        outcome: Ok(outcome),
                    })
                }
                Action::DeleteCheckpoint { id } => {
                    self.store
                        .remove(&checkpoint_path("q-1", *id).expect("valid"));
                    None
                }
                _ => None,
            };
            all.push(a);
            if let Some(e) = event {
                let more = self.d.on_event(self.now, e);
                self.check();
                queue.extend(more);
            }
        }
        all
    }

    /// A user request; returns its reply id and the actions.
    fn request(&mut self, request: Request) -> (ReplyId, Vec<Action>) {
        self.next_reply += 1;
        let reply = ReplyId(self.next_reply);
        let acts = self.feed(Event::Request { reply, request });
        (reply, acts)
    }

    fn from(&mut self, worker: &str, msg: wm::Msg) -> Vec<Action> {
        self.feed(Event::Worker {
            worker: worker.into(),
            msg,
        })
    }

    fn lost(&mut self, worker: &str) -> Vec<Action> {
        self.feed(Event::WorkerLost {
            worker: worker.into(),
            reason: "its control stream closed".into(),
        })
    }

    /// Moves the clock to the driver's next deadline and ticks.
    fn tick(&mut self) -> Vec<Action> {
        self.now = self.d.next_deadline().expect("a deadline");
        self.feed(Event::Tick)
    }

    fn state(&self) -> JobState {
        self.d.state()
    }

    fn attempt(&self) -> u64 {
        self.d.status().attempt
    }

    /// Slots on `workers`, every worker's data port, state, and every worker's tasks
    /// (`tasks_per_worker` each, node 1, consecutive subtasks): the attempt runs.
    fn deploy(&mut self, workers: &[&str], tasks_per_worker: u32) -> Vec<Action> {
        let mut acts = self.feed(Event::SlotsAcquired(
            workers.iter().map(|w| w.to_string()).collect(),
        ));
        for (i, w) in workers.iter().enumerate() {
            acts.extend(self.from(w, prepared(self.attempt(), &format!("10.0.0.{i}:7000"))));
        }
        for (i, w) in workers.iter().enumerate() {
            let first = i as u32 * tasks_per_worker;
            let tasks = (first..first + tasks_per_worker).collect::<Vec<_>>();
            acts.extend(self.from(w, deployed(self.attempt(), &tasks)));
        }
        acts
    }

    /// Every task of the running attempt acknowledges checkpoint `id`.
    fn ack_all(&mut self, id: u64, workers: &[&str], tasks_per_worker: u32) -> Vec<Action> {
        let mut acts = Vec::new();
        for (i, w) in workers.iter().enumerate() {
            let first = i as u32 * tasks_per_worker;
            for t in first..first + tasks_per_worker {
                acts.extend(self.from(w, ack(self.attempt(), id, t)));
            }
        }
        acts
    }

    /// Every worker confirms the cancellation of the current attempt.
    fn confirm_cancel(&mut self, workers: &[&str]) -> Vec<Action> {
        let attempt = self.attempt();
        let mut acts = Vec::new();
        for w in workers {
            acts.extend(self.from(w, cancelled_report(attempt)));
        }
        acts
    }
}

// ---------------------------------------------------------------------------------------
// Worker messages

fn prepared(attempt: u64, address: &str) -> wm::Msg {
    wm::Msg::Prepared(pbc::Prepared {
        attempt,
        data_address: address.into(),
        error: String::new(),
    })
}

fn task(subtask: u32) -> pbc::TaskRef {
    pbc::TaskRef {
        node: 1,
        subtask,
        source: true,
    }
}

fn deployed(attempt: u64, subtasks: &[u32]) -> wm::Msg {
    wm::Msg::Deployed(pbc::Deployed {
        attempt,
        tasks: subtasks.iter().map(|&s| task(s)).collect(),
        ..Default::default()
    })
}

fn ack(attempt: u64, checkpoint_id: u64, subtask: u32) -> wm::Msg {
    wm::Msg::Ack(pbc::CheckpointAck {
        attempt,
        checkpoint_id,
        task: Some(task(subtask)),
        source_positions: vec![pbc::SourcePosition {
            split: format!("split-{subtask}"),
            position: Bytes::from(checkpoint_id.to_be_bytes().to_vec()),
        }],
        ..Default::default()
    })
}

fn committed(attempt: u64, checkpoint_id: u64, subtask: u32) -> wm::Msg {
    wm::Msg::Ack(pbc::CheckpointAck {
        attempt,
        checkpoint_id,
        task: Some(task(subtask)),
        committed: true,
        ..Default::default()
    })
}

fn finished(attempt: u64, subtask: u32) -> wm::Msg {
    wm::Msg::Ack(pbc::CheckpointAck {
        attempt,
        task: Some(task(subtask)),
        finished: true,
        ..Default::default()
    })
}

fn final_report(attempt: u64, records: u64) -> wm::Msg {
    wm::Msg::Report(pbc::Report {
        attempt,
        r#final: true,
        records_in: records,
        records_out: records,
        ..Default::default()
    })
}

fn cancelled_report(attempt: u64) -> wm::Msg {
    wm::Msg::Report(pbc::Report {
        attempt,
        r#final: true,
        cancelled: true,
        ..Default::default()
    })
}

fn error_report(attempt: u64, error: &str, user: bool) -> wm::Msg {
    wm::Msg::Report(pbc::Report {
        attempt,
        r#final: true,
        error: error.into(),
        user_error: user,
        ..Default::default()
    })
}

// ---------------------------------------------------------------------------------------
// Reading actions

/// The messages sent, with their recipients.
fn sent(acts: &[Action]) -> Vec<(Vec<String>, cm::Msg)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Send { workers, msg } => Some((workers.clone(), (**msg).clone())),
            _ => None,
        })
        .collect()
}

/// Recipients of `Cancel`.
fn cancels(acts: &[Action]) -> Vec<String> {
    sent(acts)
        .into_iter()
        .filter(|(_, m)| matches!(m, cm::Msg::Cancel(_)))
        .flat_map(|(w, _)| w)
        .collect()
}

fn prepares(acts: &[Action]) -> Vec<u64> {
    sent(acts)
        .into_iter()
        .filter_map(|(_, m)| match m {
            cm::Msg::Prepare(p) => Some(p.attempt),
            _ => None,
        })
        .collect()
}

fn deploys(acts: &[Action]) -> Vec<pbc::Deploy> {
    sent(acts)
        .into_iter()
        .filter_map(|(_, m)| match m {
            cm::Msg::Deploy(d) => Some(d),
            _ => None,
        })
        .collect()
}

/// `(checkpoint id, final)` of the triggers sent (one per `Send`, to every worker).
fn triggers(acts: &[Action]) -> Vec<(u64, bool)> {
    sent(acts)
        .into_iter()
        .filter_map(|(_, m)| match m {
            cm::Msg::Trigger(t) => Some((t.checkpoint_id, t.final_checkpoint)),
            _ => None,
        })
        .collect()
}

fn replies(acts: &[Action]) -> Vec<(ReplyId, Result<Answer, String>)> {
    acts.iter()
        .filter_map(|a| match a {
            Action::Reply { to, answer } => Some((*to, answer.clone())),
            _ => None,
        })
        .collect()
}

/// The one answer to `to` among `acts`.
#[track_caller]
fn answer(acts: &[Action], to: ReplyId) -> Result<Answer, String> {
    let mut got = replies(acts).into_iter().filter(|(r, _)| *r == to);
    let first = got
        .next()
        .unwrap_or_else(|| panic!("no answer to {to:?} in {acts:#?}"));
    assert!(got.next().is_none(), "two answers to {to:?}");
    first.1
}

fn metadata_paths(acts: &[Action]) -> Vec<String> {
    acts.iter()
        .filter_map(|a| match a {
            Action::WriteMetadata { path, .. } => Some(path.clone()),
            _ => None,
        })
        .collect()
}

fn has(acts: &[Action], want: &Action) -> bool {
    acts.contains(want)
}

/// The parallelism of node 1 in a `Deploy`.
fn deployed_parallelism(d: &pbc::Deploy) -> u32 {
    d.deployment.as_ref().unwrap().job.as_ref().unwrap().nodes[0].parallelism
}

fn restore_of(d: &pbc::Deploy) -> Option<u64> {
    d.deployment
        .as_ref()
        .unwrap()
        .restore
        .as_ref()
        .map(|r| r.checkpoint_id)
}

/// A running job on workers a and b, two tasks each, with checkpoints (remote state when
/// `remote`).
fn running(remote: bool) -> H {
    let (mut h, acts) = H::new(2, graph(4, true, remote));
    assert!(
        has(&acts, &Action::AcquireSlots { workers: 2 }),
        "{acts:#?}"
    );
    h.deploy(&["a", "b"], 2);
    assert_eq!(h.state(), JobState::Running);
    h
}

/// Triggers the next periodic checkpoint: its id.
fn next_checkpoint(h: &mut H) -> u64 {
    let acts = h.tick();
    let t = triggers(&acts);
    assert_eq!(t.len(), 1, "one trigger: {acts:#?}");
    t[0].0
}

// ---------------------------------------------------------------------------------------
// Deploy and finish

#[test]
fn a_job_deploys_checkpoints_and_finishes() {
    let (mut h, acts) = H::new(2, graph(4, true, true));
    assert_eq!(h.state(), JobState::Scheduling);
    assert!(has(&acts, &Action::ConnectState));
    assert!(has(&acts, &Action::AcquireSlots { workers: 2 }));
    let acts = h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    assert_eq!(prepares(&acts), vec![1]);
    assert_eq!(h.d.next_deadline(), Some(T0 + DEPLOY_TIMEOUT));
    h.from("a", prepared(1, "10.0.0.1:7000"));
    let acts = h.from("b", prepared(1, "10.0.0.2:7000"));
    // A fresh job: the shards are opened, not rolled back.
    assert!(has(&acts, &Action::OpenState));
    assert!(
        !acts
            .iter()
            .any(|a| matches!(a, Action::RollbackState { .. }))
    );
    let d = deploys(&acts);
    assert_eq!(d.len(), 2);
    let dep = d[1].deployment.as_ref().unwrap();
    assert_eq!(dep.worker_index, 1);
    assert_eq!(dep.peers, vec!["10.0.0.1:7000", "10.0.0.2:7000"]);
    assert!(dep.coordinated_checkpoints);
    assert_eq!(dep.remote_state.as_ref().unwrap().first_epoch, 1);
    assert!(dep.restore.is_none());
    h.from("a", deployed(1, &[0, 1]));
    assert_eq!(h.state(), JobState::Scheduling);
    h.from("b", deployed(1, &[2, 3]));
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(h.d.status().waiting_for, None);

    // Progress reports carry each task's figures; a worker's newer report replaces its
    // tasks' older ones and leaves the other worker's.
    let progress = |task: &str, busy: u64| {
        wm::Msg::Report(pbc::Report {
            attempt: 1,
            tasks: vec![pbc::TaskMetrics {
                task: task.into(),
                busy_ms_per_s: busy,
                ..Default::default()
            }],
            ..Default::default()
        })
    };
    h.from("b", progress("window[1]", 300));
    h.from("a", progress("window[0]", 100));
    h.from("a", progress("window[0]", 200));
    let tasks: Vec<(String, String, u64)> =
        h.d.status()
            .tasks
            .iter()
            .map(|t| (t.task.clone(), t.worker.clone(), t.busy_ms_per_s))
            .collect();
    assert_eq!(
        tasks,
        [
            ("window[0]".into(), "a".into(), 200),
            ("window[1]".into(), "b".into(), 300)
        ]
    );

    // A periodic checkpoint: trigger, acks, metadata, notification, shard commit.
    let id = next_checkpoint(&mut h);
    let acts = h.ack_all(id, &["a", "b"], 2);
    assert_eq!(
        metadata_paths(&acts),
        vec![checkpoint_path("q-1", id).unwrap()]
    );
    assert!(
        sent(&acts)
            .iter()
            .any(|(_, m)| matches!(m, cm::Msg::Complete(c) if c.checkpoint_id == id))
    );
    assert!(has(
        &acts,
        &Action::CommitState {
            id,
            retained: vec![id]
        }
    ));
    assert_eq!(h.d.status().last_checkpoint, Some(id));

    // End of input: every task finished, the final checkpoint, the final reports.
    for (w, t) in [("a", 0), ("a", 1), ("b", 2)] {
        assert!(triggers(&h.from(w, finished(1, t))).is_empty());
    }
    let acts = h.from("b", finished(1, 3));
    let last = id + 1;
    assert_eq!(triggers(&acts), vec![(last, true)]);
    h.ack_all(last, &["a", "b"], 2);
    h.from("a", final_report(1, 10));
    assert_eq!(h.state(), JobState::Running);
    let acts = h.from("b", final_report(1, 5));
    assert_eq!(h.state(), JobState::Finished);
    assert!(has(&acts, &Action::ReleaseSlots));
    assert_eq!(h.d.status().records_in, 15);
    assert_eq!(
        h.d.end(),
        Some(End {
            state: JobState::Finished,
            record: true
        })
    );
}

#[test]
fn waiting_for_slots_is_not_a_failure_and_says_what_it_waits_for() {
    let (mut h, _) = H::new(3, graph(3, true, false));
    assert_eq!(
        h.d.status().waiting_for.as_deref(),
        Some("workers with a free slot: 0 of 3")
    );
    h.feed(Event::Capacity { free: 2 });
    assert_eq!(
        h.d.status().waiting_for.as_deref(),
        Some("workers with a free slot: 2 of 3")
    );
    // No deadline: an hour later the job still waits, and no restart was burnt.
    assert_eq!(h.d.next_deadline(), None);
    h.now += 3_600_000;
    assert!(h.feed(Event::Tick).is_empty());
    assert_eq!(h.state(), JobState::Scheduling);
    assert_eq!(h.d.status().restarts, 0);
    assert_eq!(h.d.status().failure, None);
    // The third worker attaches.
    let acts = h.feed(Event::SlotsAcquired(vec![
        "a".into(),
        "b".into(),
        "c".into(),
    ]));
    assert_eq!(prepares(&acts), vec![1]);
    assert_eq!(
        h.d.status().waiting_for.as_deref(),
        Some("workers to bind their data ports: 0 of 3")
    );
}

#[test]
fn a_task_that_finishes_while_others_deploy_still_counts() {
    // A source subtask without splits finishes at once, maybe before the other worker
    // deployed; and a worker without tasks ends before the others.
    let (mut h, _) = H::new(3, graph(2, true, false));
    h.feed(Event::SlotsAcquired(vec![
        "a".into(),
        "b".into(),
        "c".into(),
    ]));
    for w in ["a", "b", "c"] {
        h.from(w, prepared(1, "x:1"));
    }
    h.from("a", deployed(1, &[0]));
    h.from("a", finished(1, 0));
    h.from("c", deployed(1, &[]));
    h.from("c", final_report(1, 0));
    h.from("b", deployed(1, &[1]));
    assert_eq!(h.state(), JobState::Running);
    let acts = h.from("b", finished(1, 1));
    assert_eq!(triggers(&acts).len(), 1, "the final checkpoint: {acts:#?}");
    let id = triggers(&acts)[0].0;
    h.from("a", ack(1, id, 0));
    h.from("b", ack(1, id, 1));
    h.from("a", final_report(1, 1));
    h.from("b", final_report(1, 1));
    assert_eq!(h.state(), JobState::Finished);
}

// ---------------------------------------------------------------------------------------
// Failures during deployment

#[test]
fn a_worker_lost_during_prepare_cancels_the_others_and_restarts() {
    let (mut h, _) = H::new(2, graph(2, true, false));
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    h.from("a", prepared(1, "x:1"));
    let acts = h.lost("b");
    assert_eq!(h.state(), JobState::Failing);
    assert_eq!(cancels(&acts), vec!["a"], "the lost worker is not told");
    assert!(
        h.d.status()
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("worker b lost while deploying"))
    );
    // Nothing moves until a confirms (or the cancel timeout).
    assert!(!has(&acts, &Action::ReleaseSlots));
    let acts = h.confirm_cancel(&["a"]);
    assert!(has(&acts, &Action::ReleaseSlots));
    assert_eq!(h.state(), JobState::Restarting);
    assert_eq!(h.d.status().restarts, 1);
    assert_eq!(h.d.next_deadline(), Some(T0 + BACKOFF));
    let acts = h.tick();
    assert!(has(&acts, &Action::ReadLatestCheckpoint));
    assert!(has(&acts, &Action::AcquireSlots { workers: 2 }));
    assert_eq!(h.state(), JobState::Scheduling);
    assert_eq!(h.attempt(), 2);
    let acts = h.deploy(&["a", "c"], 1);
    assert_eq!(prepares(&acts), vec![2]);
    // Nothing completed: the attempt starts over, sinks discarding what is pending.
    assert!(deploys(&acts).iter().all(|d| restore_of(d) == Some(0)));
    assert_eq!(h.state(), JobState::Running);
}

#[test]
fn a_worker_lost_during_deploy_restarts_from_the_last_checkpoint() {
    let mut h = running(true);
    let id = next_checkpoint(&mut h);
    h.ack_all(id, &["a", "b"], 2);
    // A task fails; the next attempt loses a worker while deploying.
    let acts = h.from("a", error_report(1, "disk full", false));
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    h.confirm_cancel(&["a", "b"]);
    h.tick();
    let acts = h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    assert_eq!(prepares(&acts), vec![2]);
    h.from("a", prepared(2, "x:1"));
    let acts = h.from("b", prepared(2, "x:2"));
    // Rolled back to the checkpoint under a fence; writes start after it.
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::RollbackState { checkpoint, .. } if *checkpoint == id))
    );
    let d = deploys(&acts);
    assert_eq!(restore_of(&d[0]), Some(id));
    let positions = &d[0]
        .deployment
        .as_ref()
        .unwrap()
        .restore
        .as_ref()
        .unwrap()
        .source_positions;
    assert_eq!(positions.len(), 4, "every source task's position");
    assert_eq!(
        d[0].deployment
            .as_ref()
            .unwrap()
            .remote_state
            .as_ref()
            .unwrap()
            .first_epoch,
        id + 1
    );
    h.from("a", deployed(2, &[0, 1]));
    let acts = h.lost("b");
    assert_eq!(h.state(), JobState::Failing);
    assert_eq!(cancels(&acts), vec!["a"]);
    h.confirm_cancel(&["a"]);
    assert_eq!(h.state(), JobState::Restarting);
    assert_eq!(h.d.status().restarts, 2);
    // The back-off doubled.
    assert_eq!(h.d.next_deadline(), Some(h.now + 2 * BACKOFF));
}

/// An acknowledgement of a source task that read `records` in its attempt.
fn ack_reading(attempt: u64, checkpoint_id: u64, subtask: u32, records: u64) -> wm::Msg {
    let wm::Msg::Ack(mut a) = ack(attempt, checkpoint_id, subtask) else {
        unreachable!("ack makes an Ack")
    };
    a.source_records = records;
    wm::Msg::Ack(a)
}

fn records_at(h: &H, checkpoint_id: u64) -> u64 {
    h.store
        .values()
        .find(|m| m.checkpoint_id == checkpoint_id)
        .map(|m| m.records_in)
        .expect("the checkpoint's metadata")
}

#[test]
fn record_counts_continue_from_the_restored_checkpoint_across_attempts() {
    let mut h = running(true);
    let first = next_checkpoint(&mut h);
    for (w, t) in [("a", 0), ("a", 1), ("b", 2), ("b", 3)] {
        h.from(w, ack_reading(1, first, t, 10));
    }
    assert_eq!(records_at(&h, first), 40);
    // The attempt read on past the checkpoint, then failed: what it read after the
    // checkpoint is read again by the next attempt and counts once.
    h.from(
        "a",
        wm::Msg::Report(pbc::Report {
            attempt: 1,
            records_in: 70,
            ..Default::default()
        }),
    );
    assert_eq!(h.d.status().records_in, 70);
    h.from("a", error_report(1, "disk full", false));
    h.confirm_cancel(&["a", "b"]);
    h.tick();
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    h.from("a", prepared(2, "x:1"));
    h.from("b", prepared(2, "x:2"));
    h.from("a", deployed(2, &[0, 1]));
    h.from("b", deployed(2, &[2, 3]));
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(h.d.status().records_in, 40, "from the restored checkpoint");
    h.from(
        "b",
        wm::Msg::Report(pbc::Report {
            attempt: 2,
            records_in: 7,
            ..Default::default()
        }),
    );
    assert_eq!(h.d.status().records_in, 47);
    let second = next_checkpoint(&mut h);
    for (w, t) in [("a", 0), ("a", 1), ("b", 2), ("b", 3)] {
        h.from(w, ack_reading(2, second, t, 5));
    }
    assert_eq!(records_at(&h, second), 60);
}

#[test]
fn checkpoints_record_the_shards_placement_and_a_restart_places_them_again() {
    let mut h = running(true);
    assert_eq!(h.placements_asked, vec![vec![]], "nothing placed before");
    let id = next_checkpoint(&mut h);
    h.ack_all(id, &["a", "b"], 2);
    let meta = h.store[&checkpoint_path("q-1", id).expect("valid")].clone();
    let nodes: Vec<(u32, &str)> = meta
        .shards
        .iter()
        .map(|s| (s.range.start, s.node.as_str()))
        .collect();
    assert_eq!(nodes, vec![(0, "http://s1"), (64, "http://s2")]);
    // A state node's loss fails a task: the next attempt connects again, from where the
    // shards were, so that the placement keeps what lives and moves what died.
    h.from("a", error_report(1, "state service unavailable", false));
    h.confirm_cancel(&["a", "b"]);
    h.tick();
    assert_eq!(h.placements_asked.len(), 2, "connected again");
    assert_eq!(
        h.placements_asked[1],
        vec![
            (0..64, "http://s1".to_owned()),
            (64..128, "http://s2".to_owned())
        ]
    );
    // A new coordinator resuming from the checkpoint starts from its placement.
    let (h2, _) = H::resume(2, graph(2, true, true), Some(meta), id + 1, h.store.clone());
    assert_eq!(h2.placements_asked[0].len(), 2, "{:?}", h2.placements_asked);
}

#[test]
fn an_unreachable_state_service_is_waited_for_without_spending_restarts() {
    let mut h = running(true);
    let id = next_checkpoint(&mut h);
    h.ack_all(id, &["a", "b"], 2);
    let policy = config(2).restart.max_restarts;
    // The state node dies: a task fails with the service out of reach, and no node is
    // registered for longer than the policy has restarts.
    h.hold.unavailable_connects = policy + 5;
    h.from(
        "a",
        wm::Msg::Report(pbc::Report {
            attempt: 1,
            r#final: true,
            error: "state service write: connection refused".into(),
            unavailable: true,
            ..Default::default()
        }),
    );
    h.confirm_cancel(&["a", "b"]);
    let mut waits = Vec::new();
    for _ in 0..=policy + 5 {
        assert_eq!(h.state(), JobState::Restarting);
        let waiting = h.d.status().waiting_for.clone().unwrap_or_default();
        assert!(waiting.contains("out of reach"), "{waiting}");
        let before = h.now;
        h.tick();
        waits.push(h.now - before);
    }
    assert!(
        waits.iter().all(|&w| w <= 5_000),
        "retries are at most 5 s apart: {waits:?}"
    );
    // The node is back: the job deploys, with every restart shown and none charged.
    assert_eq!(h.state(), JobState::Scheduling, "{:?}", h.d.status());
    h.deploy(&["a", "b"], 2);
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(h.d.status().restarts, policy + 6);
    assert_eq!(h.d.restarts, 0, "nothing charged to the restart policy");
    let failures = &h.d.status().failures;
    assert_eq!(failures.len(), (policy as usize + 6).min(FAILURE_HISTORY));
    assert!(failures.iter().all(|f| f.unavailable), "{failures:?}");
    assert_eq!(failures[0].attempt, 1);

    // It finishes: the failure it recovered from is history, not its state.
    let attempt = h.attempt();
    for t in 0..4 {
        h.from(if t < 2 { "a" } else { "b" }, finished(attempt, t));
    }
    let last = h.d.status().last_checkpoint.unwrap_or(0) + 1;
    h.ack_all(last, &["a", "b"], 2);
    h.from("a", final_report(attempt, 1));
    h.from("b", final_report(attempt, 1));
    assert_eq!(h.state(), JobState::Finished);
    assert_eq!(h.d.status().failure, None);
    assert!(!h.d.status().failures.is_empty());
}

#[test]
fn a_deploy_timeout_fails_the_attempt_naming_the_late_workers() {
    let (mut h, _) = H::new(2, graph(2, true, false));
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    h.from("a", prepared(1, "x:1"));
    let acts = h.tick();
    assert_eq!(h.now, T0 + DEPLOY_TIMEOUT);
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    let failure = h.d.status().failure.clone().unwrap();
    assert!(
        failure.contains("did not bind their data ports"),
        "{failure}"
    );
    assert!(failure.ends_with(": b"), "{failure}");
    // Workers that do not confirm the cancellation are given up on after a while.
    let acts = h.tick();
    assert!(has(&acts, &Action::ReleaseSlots));
    assert_eq!(h.state(), JobState::Restarting);
    // The deploy step has a deadline of its own, from when Deploy was sent.
    h.tick();
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    h.now += 900;
    h.from("a", prepared(2, "x:1"));
    h.from("b", prepared(2, "x:2"));
    assert_eq!(h.d.next_deadline(), Some(h.now + DEPLOY_TIMEOUT));
    h.from("b", deployed(2, &[1]));
    h.tick();
    let failure = h.d.status().failure.clone().unwrap();
    assert!(failure.contains("did not deploy their tasks"), "{failure}");
    assert!(failure.ends_with(": a"), "{failure}");
}

#[test]
fn the_restart_policy_gives_up_after_its_restarts() {
    let mut h = running(false);
    for attempt in 1..=3 {
        h.from("a", error_report(attempt, "boom", false));
        h.confirm_cancel(&["a", "b"]);
        if attempt == 3 {
            break;
        }
        assert_eq!(h.state(), JobState::Restarting);
        h.tick();
        h.deploy(&["a", "b"], 2);
    }
    assert_eq!(h.state(), JobState::Failed);
    assert_eq!(h.d.status().restarts, 2);
    let failure = h.d.status().failure.clone().unwrap();
    assert!(
        failure.contains("worker a: boom") && failure.contains("allows 2 restarts"),
        "{failure}"
    );
    assert!(h.d.end().is_some_and(|e| e.record));
}

#[test]
fn a_user_error_and_a_job_without_checkpoints_are_not_restarted() {
    let mut h = running(false);
    h.from("b", error_report(1, "no such column `x`", true));
    h.confirm_cancel(&["a", "b"]);
    assert_eq!(h.state(), JobState::Failed);
    assert!(h.d.status().user_error);
    assert_eq!(h.d.status().restarts, 0);

    let (mut h, _) = H::new(1, graph(1, false, false));
    h.deploy(&["a"], 1);
    h.lost("a");
    assert_eq!(
        h.state(),
        JobState::Failed,
        "nothing to wait for: a is gone"
    );
}

#[test]
fn a_fenced_coordinator_steps_down_without_recording_the_end() {
    let mut h = running(false);
    let id = next_checkpoint(&mut h);
    // Another coordinator wrote this id first.
    h.store.insert(
        checkpoint_path("q-1", id).unwrap(),
        CheckpointMetadata::default(),
    );
    let acts = h.ack_all(id, &["a", "b"], 2);
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    h.confirm_cancel(&["a", "b"]);
    assert_eq!(h.state(), JobState::Failed);
    assert_eq!(
        h.d.end(),
        Some(End {
            state: JobState::Failed,
            record: false
        })
    );
}

// ---------------------------------------------------------------------------------------
// Cancel

#[test]
fn cancel_while_waiting_for_slots_ends_at_once() {
    let (mut h, _) = H::new(2, graph(2, true, false));
    let (r, acts) = h.request(Request::Cancel);
    assert_eq!(answer(&acts, r), Ok(Answer::Cancelled));
    assert!(has(&acts, &Action::ReleaseSlots));
    assert_eq!(h.state(), JobState::Cancelled);
    // Slots that come through afterwards are given back.
    let acts = h.d.on_event(h.now, Event::SlotsAcquired(vec!["a".into()]));
    assert!(acts.is_empty(), "the job has ended: {acts:?}");
}

#[test]
fn cancel_during_the_back_off_ends_at_once() {
    let mut h = running(false);
    h.lost("a");
    h.confirm_cancel(&["b"]);
    assert_eq!(h.state(), JobState::Restarting);
    let (r, acts) = h.request(Request::Cancel);
    assert_eq!(answer(&acts, r), Ok(Answer::Cancelled));
    assert!(cancels(&acts).is_empty(), "no attempt runs");
    assert_eq!(h.state(), JobState::Cancelled);
    assert_eq!(h.d.next_deadline(), None);
}

#[test]
fn cancel_during_the_restore_stops_the_prepared_workers() {
    let (mut h, _) = H::resume(
        2,
        graph(2, true, true),
        Some(CheckpointMetadata {
            job_id: "q-1".into(),
            checkpoint_id: 7,
            ..Default::default()
        }),
        8,
        BTreeMap::new(),
    );
    h.hold.rollback = true;
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    h.from("a", prepared(1, "x:1"));
    h.from("b", prepared(1, "x:2"));
    assert!(matches!(
        h.held.as_slice(),
        [Action::RollbackState { checkpoint: 7, .. }]
    ));
    assert!(
        h.d.status()
            .waiting_for
            .as_deref()
            .is_some_and(|w| w.contains("checkpoint 7"))
    );
    let (r, acts) = h.request(Request::Cancel);
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    assert!(
        replies(&acts).is_empty(),
        "answered once the workers stopped"
    );
    // The rollback's answer comes late: nothing is deployed.
    let acts = h.feed(Event::StateRolledBack(Ok(())));
    assert!(deploys(&acts).is_empty());
    h.from("a", cancelled_report(1));
    let acts = h.from("b", cancelled_report(1));
    assert_eq!(answer(&acts, r), Ok(Answer::Cancelled));
    assert_eq!(h.state(), JobState::Cancelled);
}

#[test]
fn cancel_while_an_attempt_is_being_cancelled_for_a_restart_ends_the_job() {
    let mut h = running(false);
    h.from("a", error_report(1, "boom", false));
    assert_eq!(h.state(), JobState::Failing);
    let (r, acts) = h.request(Request::Cancel);
    assert!(replies(&acts).is_empty());
    let acts = h.confirm_cancel(&["a", "b"]);
    assert_eq!(answer(&acts, r), Ok(Answer::Cancelled));
    assert_eq!(h.state(), JobState::Cancelled);
    assert_eq!(h.d.status().restarts, 0);
}

// ---------------------------------------------------------------------------------------
// Savepoints and stop

#[test]
fn a_savepoint_while_the_job_is_not_running_is_refused_with_what_it_does() {
    let (mut h, _) = H::new(2, graph(2, true, false));
    h.feed(Event::Capacity { free: 1 });
    let (r, acts) = h.request(Request::Savepoint { name: "sp".into() });
    let refused = answer(&acts, r).unwrap_err();
    assert!(
        refused.contains("being scheduled") && refused.contains("1 of 2"),
        "{refused}"
    );
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    let (r, acts) = h.request(Request::Stop {
        savepoint: Some("sp".into()),
    });
    let refused = answer(&acts, r).unwrap_err();
    assert!(refused.contains("being deployed (attempt 1)"), "{refused}");
    let (r, acts) = h.request(Request::Rescale { parallelism: 3 });
    assert!(answer(&acts, r).unwrap_err().contains("being deployed"));
    // The deployment goes on unharmed.
    h.from("a", prepared(1, "x:1"));
    h.from("b", prepared(1, "x:2"));
    h.from("a", deployed(1, &[0]));
    h.from("b", deployed(1, &[1]));
    assert_eq!(h.state(), JobState::Running);
    let (r, acts) = h.request(Request::Savepoint { name: "sp".into() });
    assert!(replies(&acts).iter().all(|(to, _)| *to != r));
    let id = triggers(&acts)[0].0;
    let acts = h.ack_all(id, &["a", "b"], 1);
    assert_eq!(
        metadata_paths(&acts),
        vec![
            checkpoint_path("q-1", id).unwrap(),
            savepoint_path("q-1", "sp").unwrap()
        ]
    );
    assert_eq!(
        answer(&acts, r),
        Ok(Answer::Savepoint(savepoint_path("q-1", "sp").unwrap()))
    );
}

#[test]
fn a_savepoint_waits_for_its_shards_to_commit() {
    let mut h = running(true);
    h.hold.commit = true;
    let (r, acts) = h.request(Request::Savepoint { name: "sp".into() });
    let id = triggers(&acts)[0].0;
    let acts = h.ack_all(id, &["a", "b"], 2);
    assert!(replies(&acts).is_empty(), "the shards did not commit yet");
    let acts = h.feed(Event::StateCommitted { id, result: Ok(()) });
    assert!(answer(&acts, r).is_ok());
}

#[test]
fn a_savepoint_whose_name_is_taken_does_not_stop_the_job() {
    let mut h = running(false);
    h.store.insert(
        savepoint_path("q-1", "sp").unwrap(),
        CheckpointMetadata::default(),
    );
    let (r, acts) = h.request(Request::Stop {
        savepoint: Some("sp".into()),
    });
    let id = triggers(&acts)[0].0;
    let acts = h.ack_all(id, &["a", "b"], 2);
    let refused = answer(&acts, r).unwrap_err();
    assert!(
        refused.contains("exists already") && refused.contains("not stopped"),
        "{refused}"
    );
    assert!(cancels(&acts).is_empty());
    assert_eq!(h.state(), JobState::Running);
    // Periodic checkpoints resume.
    assert_eq!(triggers(&h.tick()).len(), 1);
}

#[test]
fn a_stop_waits_for_every_task_to_commit_the_savepoint_output() {
    let mut h = running(false);
    let (r, acts) = h.request(Request::Stop {
        savepoint: Some("sp".into()),
    });
    let id = triggers(&acts)[0].0;
    let acts = h.ack_all(id, &["a", "b"], 2);
    assert!(replies(&acts).is_empty());
    assert!(cancels(&acts).is_empty());
    // No periodic checkpoint meanwhile: only the stop's deadline.
    assert_eq!(h.d.next_deadline(), Some(h.now + 700));
    for t in [0, 1, 2] {
        assert!(cancels(&h.from(if t < 2 { "a" } else { "b" }, committed(1, id, t))).is_empty());
    }
    let acts = h.from("b", committed(1, id, 3));
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    let acts = h.confirm_cancel(&["a", "b"]);
    let path = savepoint_path("q-1", "sp").unwrap();
    assert_eq!(
        answer(&acts, r),
        Ok(Answer::Stopped(StopOutcome {
            savepoint: path,
            warning: None
        }))
    );
    assert_eq!(h.state(), JobState::Cancelled);
}

#[test]
fn a_stop_whose_tasks_do_not_confirm_in_time_stops_with_a_warning() {
    let mut h = running(false);
    let (r, acts) = h.request(Request::Stop {
        savepoint: Some("sp".into()),
    });
    let id = triggers(&acts)[0].0;
    h.ack_all(id, &["a", "b"], 2);
    h.from("a", committed(1, id, 0));
    let acts = h.tick();
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    let acts = h.confirm_cancel(&["a", "b"]);
    let Ok(Answer::Stopped(outcome)) = answer(&acts, r) else {
        panic!("{acts:#?}");
    };
    let warning = outcome.warning.expect("a warning");
    assert!(
        warning.contains("3 task(s)") && warning.contains("1#3"),
        "{warning}"
    );
}

#[test]
fn stop_without_a_savepoint_and_a_job_without_checkpoints() {
    let (mut h, _) = H::new(1, graph(1, false, false));
    h.deploy(&["a"], 1);
    let (r, acts) = h.request(Request::Savepoint { name: "sp".into() });
    assert!(
        answer(&acts, r)
            .unwrap_err()
            .contains("takes no checkpoints")
    );
    let (r, acts) = h.request(Request::Rescale { parallelism: 2 });
    assert!(
        answer(&acts, r)
            .unwrap_err()
            .starts_with("rescaling resumes from a checkpoint")
    );
    let (r, acts) = h.request(Request::Stop { savepoint: None });
    assert_eq!(cancels(&acts), vec!["a"]);
    let acts = h.confirm_cancel(&["a"]);
    assert_eq!(
        answer(&acts, r),
        Ok(Answer::Stopped(StopOutcome {
            savepoint: String::new(),
            warning: None
        }))
    );
}

// ---------------------------------------------------------------------------------------
// Rescale

/// Rescales the running job on a and b (two tasks each) to `p` (one task per subtask,
/// spread over a and b); returns the rescale's checkpoint id.
fn rescale(h: &mut H, p: u32) -> u64 {
    let (r, acts) = h.request(Request::Rescale { parallelism: p });
    let id = triggers(&acts)[0].0;
    let acts = h.ack_all(id, &["a", "b"], h.d.graph().nodes[0].parallelism / 2);
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    assert_eq!(h.state(), JobState::Rescaling);
    h.confirm_cancel(&["a", "b"]);
    let acts = h.deploy(&["a", "b"], p / 2);
    assert!(deploys(&acts).iter().all(|d| deployed_parallelism(d) == p));
    assert!(deploys(&acts).iter().all(|d| restore_of(d) == Some(id)));
    let Ok(Answer::Rescaled(outcome)) = answer(&acts, r) else {
        panic!("{acts:#?}");
    };
    assert_eq!(outcome.checkpoint_id, id);
    assert_eq!(outcome.parallelism, p);
    assert!(!outcome.unchanged);
    assert_eq!(h.state(), JobState::Running);
    id
}

#[test]
fn a_rescale_while_a_checkpoint_is_in_flight() {
    let mut h = running(true);
    let periodic = next_checkpoint(&mut h);
    h.from("a", ack(1, periodic, 0));
    let (r, acts) = h.request(Request::Rescale { parallelism: 8 });
    assert!(has(&acts, &Action::ReadRestoreBytes));
    let id = triggers(&acts)[0].0;
    assert_eq!(id, periodic + 1);
    // The rescale's checkpoint completes first; the periodic one is aborted with the
    // attempt.
    let acts = h.ack_all(id, &["a", "b"], 2);
    // An ordinary checkpoint: no savepoint is left behind.
    assert_eq!(
        metadata_paths(&acts),
        vec![checkpoint_path("q-1", id).unwrap()]
    );
    assert_eq!(
        h.store[&checkpoint_path("q-1", id).unwrap()].savepoint,
        None
    );
    assert!(
        sent(&acts)
            .iter()
            .any(|(_, m)| matches!(m, cm::Msg::Abort(a) if a.checkpoint_id == periodic))
    );
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    assert_eq!(h.state(), JobState::Rescaling);
    // Late acks of the aborted checkpoint change nothing.
    assert!(h.from("b", ack(1, periodic, 2)).is_empty());
    let acts = h.confirm_cancel(&["a", "b"]);
    assert!(has(&acts, &Action::ReleaseSlots));
    assert!(has(&acts, &Action::AcquireSlots { workers: 2 }));
    assert_eq!(h.d.status().parallelism, 8);
    let acts = h.deploy(&["a", "b"], 4);
    assert!(deploys(&acts).iter().all(|d| deployed_parallelism(d) == 8));
    let Ok(Answer::Rescaled(outcome)) = answer(&acts, r) else {
        panic!("{acts:#?}");
    };
    assert_eq!(outcome.checkpoint_id, id);
    assert_eq!(outcome.state_bytes_restored, 0);
    assert_eq!(h.state(), JobState::Running);
    // The next checkpoint waits for the eight new tasks and records the new graph.
    let next = next_checkpoint(&mut h);
    assert_eq!(
        h.d.protocol
            .as_ref()
            .unwrap()
            .waiting_for(next)
            .unwrap()
            .len(),
        8
    );
    h.ack_all(next, &["a", "b"], 4);
    let m = &h.store[&checkpoint_path("q-1", next).unwrap()];
    assert_eq!(m.parallelism, BTreeMap::from([(1, 8), (2, 8)]));
}

#[test]
fn a_rescale_to_the_current_parallelism_changes_nothing_and_says_so() {
    let mut h = running(false);
    let (r, acts) = h.request(Request::Rescale { parallelism: 4 });
    let Ok(Answer::Rescaled(outcome)) = answer(&acts, r) else {
        panic!("{acts:#?}");
    };
    assert!(outcome.unchanged, "{outcome:?}");
    assert!(outcome.message.contains("already"), "{outcome:?}");
    assert!(triggers(&acts).is_empty() && cancels(&acts).is_empty());
    let (r, acts) = h.request(Request::Rescale { parallelism: 129 });
    assert!(
        answer(&acts, r)
            .unwrap_err()
            .contains("max_parallelism (128)")
    );
    assert_eq!(h.state(), JobState::Running);
}

#[test]
fn an_aborted_rescale_checkpoint_leaves_the_job_running() {
    let mut h = running(false);
    let (r, acts) = h.request(Request::Rescale { parallelism: 2 });
    let id = triggers(&acts)[0].0;
    let (r2, acts) = h.request(Request::Rescale { parallelism: 6 });
    assert!(
        answer(&acts, r2)
            .unwrap_err()
            .contains("being rescaled to parallelism 2")
    );
    let acts = h.from(
        "a",
        wm::Msg::Decline(pbc::CheckpointDecline {
            attempt: 1,
            checkpoint_id: id,
            task: Some(task(0)),
            reason: "busy".into(),
        }),
    );
    assert!(answer(&acts, r).unwrap_err().contains("aborted"));
    assert_eq!(h.state(), JobState::Running);
    assert_eq!(triggers(&h.tick()).len(), 1, "periodic checkpoints resume");
}

#[test]
fn a_failed_redeploy_answers_the_rescale_and_restarts_from_its_checkpoint() {
    let mut h = running(false);
    let (r, acts) = h.request(Request::Rescale { parallelism: 2 });
    let id = triggers(&acts)[0].0;
    h.ack_all(id, &["a", "b"], 2);
    h.confirm_cancel(&["a", "b"]);
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    let acts = h.lost("a");
    assert!(
        answer(&acts, r)
            .unwrap_err()
            .contains("did not come up at parallelism 2")
    );
    assert_eq!(h.state(), JobState::Failing);
    h.confirm_cancel(&["b"]);
    h.tick();
    let acts = h.deploy(&["a", "b"], 1);
    assert!(deploys(&acts).iter().all(|d| restore_of(d) == Some(id)));
    assert!(deploys(&acts).iter().all(|d| deployed_parallelism(d) == 2));
    assert_eq!(h.state(), JobState::Running);
}

#[test]
fn a_stop_after_a_rescale_takes_its_savepoint_from_the_new_tasks() {
    let mut h = running(true);
    rescale(&mut h, 8);
    let (r, acts) = h.request(Request::Stop {
        savepoint: Some("after".into()),
    });
    let id = triggers(&acts)[0].0;
    // Four tasks per worker must acknowledge and then confirm the commit.
    let acts = h.ack_all(id, &["a", "b"], 2);
    assert!(
        metadata_paths(&acts).is_empty(),
        "half the tasks acknowledged"
    );
    h.ack_all(id, &["a", "b"], 4);
    let copy = &h.store[&savepoint_path("q-1", "after").unwrap()];
    assert_eq!(copy.parallelism, BTreeMap::from([(1, 8), (2, 8)]));
    for s in 0..8 {
        let w = if s < 4 { "a" } else { "b" };
        h.from(w, committed(h.attempt(), id, s));
    }
    let acts = h.confirm_cancel(&["a", "b"]);
    assert!(matches!(answer(&acts, r), Ok(Answer::Stopped(o)) if o.warning.is_none()));
    assert_eq!(h.state(), JobState::Cancelled);
}

#[test]
fn a_coordinator_restart_during_a_rescale_resumes_from_the_latest_valid_checkpoint() {
    // The first coordinator: a checkpoint, then a rescale whose checkpoint commits; it
    // dies while the new attempt is being deployed.
    let mut h = running(true);
    let c1 = next_checkpoint(&mut h);
    h.ack_all(c1, &["a", "b"], 2);
    let (_, acts) = h.request(Request::Rescale { parallelism: 8 });
    let id = triggers(&acts)[0].0;
    h.ack_all(id, &["a", "b"], 2);
    h.confirm_cancel(&["a", "b"]);
    h.feed(Event::SlotsAcquired(vec!["a".into(), "b".into()]));
    let store = h.store.clone();
    drop(h);

    // The new coordinator resumes from the newest valid `_metadata` in the store: the
    // rescale's checkpoint, at the parallelism it recorded.
    let latest = store
        .values()
        .max_by_key(|m| m.checkpoint_id)
        .cloned()
        .unwrap();
    assert_eq!(latest.checkpoint_id, id);
    let graph = pb::JobGraph::decode(latest.job_graph.clone()).unwrap();
    assert_eq!(graph.nodes[0].parallelism, 4);
    let (mut h, _) = H::resume(2, graph, Some(latest), id + 1, store);
    assert_eq!(h.d.status().last_checkpoint, Some(id));
    let acts = h.deploy(&["c", "d"], 2);
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::RollbackState { checkpoint, .. } if *checkpoint == id))
    );
    assert!(deploys(&acts).iter().all(|d| restore_of(d) == Some(id)));
    assert!(deploys(&acts).iter().all(|d| deployed_parallelism(d) == 4));
    assert_eq!(h.state(), JobState::Running);
    // Ids continue after the store's, and retention counts the resumed checkpoint.
    let next = next_checkpoint(&mut h);
    assert_eq!(next, id + 1);
    let acts = h.ack_all(next, &["c", "d"], 2);
    assert!(has(
        &acts,
        &Action::CommitState {
            id: next,
            retained: vec![id, next]
        }
    ));
}

// ---------------------------------------------------------------------------------------
// The final checkpoint and the lifecycle

#[test]
fn the_final_checkpoint_is_retried_then_fails_the_attempt() {
    let mut h = running(false);
    for t in 0..3 {
        h.from(if t < 2 { "a" } else { "b" }, finished(1, t));
    }
    let acts = h.from("b", finished(1, 3));
    let first = triggers(&acts)[0].0;
    assert_eq!(triggers(&acts), vec![(first, true)]);
    // Each try times out; the next one is taken at once.
    for n in 1..3 {
        let acts = h.tick();
        assert_eq!(triggers(&acts), vec![(first + n, true)]);
        assert_eq!(h.state(), JobState::Running);
    }
    let acts = h.tick();
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    assert_eq!(h.state(), JobState::Failing);
    assert!(
        h.d.status()
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("final checkpoint failed 3 times"))
    );
}

#[test]
fn an_illegal_transition_fails_the_job_loudly() {
    let mut h = running(false);
    // A bug: the driver asks the lifecycle for something impossible.
    assert!(!h.d.transition(JobEvent::Restarted));
    assert_eq!(h.d.illegal_transitions().len(), 1);
    let acts = h.d.on_event(h.now, Event::Tick);
    assert_eq!(cancels(&acts), vec!["a", "b"]);
    assert!(has(&acts, &Action::ReleaseSlots));
    assert_eq!(h.d.state(), JobState::Failed);
    assert!(
        h.d.status()
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("internal error") && f.contains("Restarted"))
    );
    assert!(h.d.end().is_some());
}

// ---------------------------------------------------------------------------------------
// Watermark alignment

#[test]
fn each_worker_hears_the_alignment_minimum_of_the_other_workers() {
    let mut h = running(false);
    let attempt = h.attempt();
    let report = |subtask: u32, watermark: Option<i64>| {
        wm::Msg::SourceWatermarks(pbc::SourceWatermarks {
            attempt,
            tasks: vec![pbc::SourceWatermark {
                task: Some(task(subtask)),
                group: "bids".into(),
                watermark,
            }],
        })
    };
    let aligned = |acts: &[Action]| -> Vec<(Vec<String>, Option<i64>)> {
        sent(acts)
            .into_iter()
            .filter_map(|(to, m)| match m {
                cm::Msg::Align(a) if a.attempt == attempt && a.group == "bids" => {
                    Some((to, a.watermark))
                }
                _ => None,
            })
            .collect()
    };
    let one = |w: &str| vec![w.to_string()];
    assert_eq!(
        aligned(&h.from("a", report(0, Some(5_000)))),
        [(one("a"), None)]
    );
    // Worker b's source is behind: a hears of it, b of a's.
    assert_eq!(
        aligned(&h.from("b", report(2, Some(1_000)))),
        [(one("a"), Some(1_000)), (one("b"), Some(5_000))]
    );
    assert_eq!(
        aligned(&h.from("a", report(0, Some(9_000)))),
        [(one("b"), Some(9_000))]
    );
    // A report of an earlier attempt changes nothing.
    let stale = wm::Msg::SourceWatermarks(pbc::SourceWatermarks {
        attempt: attempt - 1,
        tasks: vec![pbc::SourceWatermark {
            task: Some(task(2)),
            group: "bids".into(),
            watermark: None,
        }],
    });
    assert_eq!(aligned(&h.from("b", stale)), []);
    // b's source finished: nothing holds a back.
    assert_eq!(aligned(&h.from("b", report(2, None))), [(one("a"), None)]);
}

#[test]
fn moving_shards_checkpoints_and_places_them_again_only_when_something_must_move() {
    let mut h = running(true);
    let live = |nodes: &[&str]| nodes.iter().map(|n| format!("http://{n}")).collect();
    let unchanged = |h: &mut H, off: Option<&str>, nodes: &[&str], why: &str| {
        let (r, acts) = h.request(Request::MoveShards {
            off: off.map(|n| format!("http://{n}")),
            live: live(nodes),
        });
        match answer(&acts, r) {
            Ok(Answer::Rescaled(o)) => {
                assert!(o.unchanged && o.message.contains(why), "{o:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(triggers(&acts).is_empty(), "no checkpoint for nothing");
    };
    unchanged(
        &mut h,
        Some("s3"),
        &["s1", "s2"],
        "none of the job's shards is on",
    );
    unchanged(&mut h, None, &["s1", "s2"], "spread evenly");
    unchanged(&mut h, None, &["s1", "s2", "s3"], "spread evenly");

    // s2 is drained: a checkpoint, then a redeploy that connects again from where the
    // shards were (and the placement moves s2's shard).
    let (r, acts) = h.request(Request::MoveShards {
        off: Some("http://s2".into()),
        live: live(&["s1"]),
    });
    let id = triggers(&acts)[0].0;
    h.ack_all(id, &["a", "b"], 2);
    h.confirm_cancel(&["a", "b"]);
    assert_eq!(h.placements_asked.len(), 2, "connected again");
    assert_eq!(h.placements_asked[1][1], (64..128, "http://s2".to_owned()));
    assert!(!h.d.balancing(), "a drain keeps what may stay");
    // (The harness answers the new connection's restored bytes with 0.)
    let acts = h.deploy(&["a", "b"], 2);
    match answer(&acts, r) {
        Ok(Answer::Rescaled(o)) => {
            assert!(!o.unchanged, "{o:?}");
            assert!(o.message.contains("moved the job's state shards"), "{o:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.d.status().restarts, 0, "a move is not a failure");
}

#[test]
fn a_resumed_job_shows_the_history_earlier_coordinators_recorded() {
    let mut h = running(true);
    let id = next_checkpoint(&mut h);
    h.ack_all(id, &["a", "b"], 2);
    let meta = h.store[&checkpoint_path("q-1", id).expect("valid")].clone();
    let failures = vec![
        FailureRecord {
            attempt: 1,
            at_ms: T0 + 5,
            reason: "worker a: disk full".into(),
            unavailable: false,
        },
        FailureRecord {
            attempt: 2,
            at_ms: T0 + 9,
            reason: "state service: out of reach".into(),
            unavailable: true,
        },
    ];
    let d = Driver::new(Setup {
        config: config(2),
        graph: graph(2, true, true),
        resume: Some(meta.clone()),
        first_checkpoint_id: id + 1,
        now: T0 + 100,
        history: JobHistory {
            checkpoints: vec![meta],
            failures: failures.clone(),
        },
    });
    let status = d.status();
    assert_eq!(status.checkpoints.len(), 1);
    assert_eq!(status.checkpoints[0].id, id);
    assert_eq!(status.last_checkpoint, Some(id));
    assert_eq!(status.failures, failures);
    assert_eq!(status.restarts, 2);
    assert_eq!(status.failure, None, "the job is not failing now");
    assert_eq!(
        d.attempt, 2,
        "attempts continue after the newest failed one"
    );
}
