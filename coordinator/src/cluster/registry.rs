//! The workers attached to this coordinator and who owns their slots.
//!
//! Every worker's control stream feeds [`Registry::deliver`]; messages of a worker whose
//! slot a job holds go to that job's [`WorkerEvent`] channel, heartbeats only refresh the
//! worker. A worker is lost when its stream ends or it misses heartbeats for the timeout
//! ([`Registry::reap`]); the jobs holding its slots hear of it as [`WorkerEvent::Lost`].
//!
//! ## What it must not know
//!
//! Jobs are names with a channel here: the registry knows workers, slots and heartbeats,
//! and nothing of what a job does with them (no type of `crate::job`). Whoever holds a
//! slot decides what a message or a loss means.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_common::pb::cluster as pbc;
use sluice_common::pb::cluster::{coordinator_message as cm, worker_message as wm};
use tokio::sync::{Notify, mpsc};

/// Sends control messages to one worker.
pub type WorkerTx = mpsc::UnboundedSender<Result<pbc::CoordinatorMessage, tonic::Status>>;

/// What a job hears about the workers whose slots it holds.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkerEvent {
    /// A control message from the worker (never a heartbeat).
    Message {
        /// The worker.
        worker: String,
        /// The message.
        msg: wm::Msg,
    },
    /// The worker is gone: its stream ended or it missed its heartbeats.
    Lost {
        /// The worker.
        worker: String,
        /// Why.
        reason: String,
    },
}

/// Where a job's [`WorkerEvent`]s go.
pub type JobEvents = mpsc::UnboundedSender<WorkerEvent>;

/// One attached worker.
#[derive(Debug)]
struct Worker {
    /// Registration order, for stable placement.
    seq: u64,
    pid: u32,
    host: String,
    name: String,
    slots: u32,
    owners: Vec<String>,
    last_seen: Instant,
    rss_bytes: u64,
    tx: WorkerTx,
}

/// A worker as the REST API shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerView {
    /// Its id.
    pub id: String,
    /// Its process id.
    pub pid: u32,
    /// Its host.
    pub host: String,
    /// The name it was started with.
    pub name: String,
    /// Its slots.
    pub slots: u32,
    /// The jobs using its slots.
    pub jobs: Vec<String>,
    /// Its resident memory at the last heartbeat.
    pub rss_bytes: u64,
}

/// A worker handed to a job.
#[derive(Debug, Clone)]
pub struct WorkerHandle {
    /// Its id.
    pub id: String,
    /// Its process id (for messages).
    pub pid: u32,
    tx: WorkerTx,
}

impl WorkerHandle {
    /// Sends `msg`; false when the worker's stream is gone.
    pub fn send(&self, msg: cm::Msg) -> bool {
        self.tx
            .send(Ok(pbc::CoordinatorMessage { msg: Some(msg) }))
            .is_ok()
    }
}

#[derive(Default)]
struct Inner {
    workers: BTreeMap<String, Worker>,
    jobs: HashMap<String, JobEvents>,
    next_seq: u64,
}

/// The attached workers.
pub struct Registry {
    inner: Mutex<Inner>,
    /// Woken when a worker attaches or a slot frees up.
    changed: Notify,
    /// A worker silent this long is lost.
    pub heartbeat_timeout: Duration,
}

impl Registry {
    /// An empty registry.
    pub fn new(heartbeat_timeout: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            changed: Notify::new(),
            heartbeat_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a worker that registered; returns its id.
    ///
    /// `greeting(id)` is the first message the worker gets: it is queued before the
    /// worker becomes visible, so no job's message can overtake it.
    pub fn attach(
        &self,
        reg: &pbc::Register,
        tx: WorkerTx,
        greeting: impl FnOnce(&str) -> pbc::CoordinatorMessage,
    ) -> String {
        let mut inner = self.lock();
        inner.next_seq += 1;
        let seq = inner.next_seq;
        let id = format!("w{seq}-{}", reg.pid);
        let _ = tx.send(Ok(greeting(&id)));
        inner.workers.insert(
            id.clone(),
            Worker {
                seq,
                pid: reg.pid,
                host: reg.host.clone(),
                name: reg.name.clone(),
                slots: reg.slots.max(1),
                owners: Vec::new(),
                last_seen: Instant::now(),
                rss_bytes: 0,
                tx,
            },
        );
        drop(inner);
        self.changed.notify_waiters();
        id
    }

    /// A message from worker `id`: heartbeats refresh it, the rest go to its jobs.
    pub fn deliver(&self, id: &str, msg: wm::Msg) {
        let mut inner = self.lock();
        let Some(w) = inner.workers.get_mut(id) else {
            return;
        };
        w.last_seen = Instant::now();
        if let wm::Msg::Heartbeat(h) = &msg {
            w.rss_bytes = h.rss_bytes;
            return;
        }
        let owners = w.owners.clone();
        for job in owners {
            if let Some(events) = inner.jobs.get(&job) {
                let _ = events.send(WorkerEvent::Message {
                    worker: id.to_string(),
                    msg: msg.clone(),
                });
            }
        }
    }

    /// Worker `id` is gone: its jobs are told.
    pub fn lost(&self, id: &str, reason: &str) {
        let mut inner = self.lock();
        let Some(w) = inner.workers.remove(id) else {
            return;
        };
        if w.owners.is_empty() {
            tracing::info!(worker = id, pid = w.pid, "idle worker gone: {reason}");
        } else {
            tracing::warn!(worker = id, pid = w.pid, "worker lost: {reason}");
        }
        for job in &w.owners {
            if let Some(events) = inner.jobs.get(job) {
                let _ = events.send(WorkerEvent::Lost {
                    worker: id.to_string(),
                    reason: reason.to_string(),
                });
            }
        }
    }

    /// Declares every worker silent for longer than the timeout lost.
    pub fn reap(&self) {
        let silent: Vec<String> = self
            .lock()
            .workers
            .iter()
            .filter(|(_, w)| w.last_seen.elapsed() > self.heartbeat_timeout)
            .map(|(id, _)| id.clone())
            .collect();
        for id in silent {
            let reason = format!("no heartbeat for {:?}", self.heartbeat_timeout);
            self.lost(&id, &reason);
        }
    }

    /// Sends what happens to the workers `job` holds slots on to `events`.
    pub fn add_job(&self, job: &str, events: JobEvents) {
        self.lock().jobs.insert(job.to_string(), events);
    }

    /// Forgets `job`: its channel and its slots.
    pub fn remove_job(&self, job: &str) {
        self.lock().jobs.remove(job);
        self.release(job);
    }

    /// Takes a slot on each of `n` workers for `job` (the longest attached first), or
    /// none when fewer than `n` have a free slot.
    pub fn acquire(&self, job: &str, n: usize) -> Option<Vec<WorkerHandle>> {
        let mut inner = self.lock();
        let mut free: Vec<(&String, &Worker)> = inner
            .workers
            .iter()
            .filter(|(_, w)| {
                w.owners.len() < w.slots as usize && !w.owners.iter().any(|o| o == job)
            })
            .collect();
        if free.len() < n {
            return None;
        }
        free.sort_by_key(|(_, w)| w.seq);
        let ids: Vec<String> = free.iter().take(n).map(|(id, _)| (*id).clone()).collect();
        let mut handles = Vec::with_capacity(n);
        for id in ids {
            let w = inner.workers.get_mut(&id).expect("listed above");
            w.owners.push(job.to_string());
            handles.push(WorkerHandle {
                id,
                pid: w.pid,
                tx: w.tx.clone(),
            });
        }
        Some(handles)
    }

    /// Gives `job`'s slots on every worker back.
    pub fn release(&self, job: &str) {
        let mut inner = self.lock();
        for w in inner.workers.values_mut() {
            w.owners.retain(|o| o != job);
        }
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Whether worker `id` is attached (not lost).
    pub fn is_attached(&self, id: &str) -> bool {
        self.lock().workers.contains_key(id)
    }

    /// Number of workers with a free slot.
    pub fn free_workers(&self) -> usize {
        self.lock()
            .workers
            .values()
            .filter(|w| w.owners.len() < w.slots as usize)
            .count()
    }

    /// Number of workers `job` could take a slot on now (a free slot, none of it `job`'s).
    pub fn free_for(&self, job: &str) -> usize {
        self.lock()
            .workers
            .values()
            .filter(|w| w.owners.len() < w.slots as usize && !w.owners.iter().any(|o| o == job))
            .count()
    }

    /// Resolves when a worker attaches or a slot frees up (or after `max`).
    pub async fn wait_for_change(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.changed.notified()).await;
    }

    /// Every worker, for the REST API.
    pub fn view(&self) -> Vec<WorkerView> {
        self.lock()
            .workers
            .iter()
            .map(|(id, w)| WorkerView {
                id: id.clone(),
                pid: w.pid,
                host: w.host.clone(),
                name: w.name.clone(),
                slots: w.slots,
                jobs: w.owners.clone(),
                rss_bytes: w.rss_bytes,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(
        r: &Registry,
        slots: u32,
    ) -> (
        String,
        mpsc::UnboundedReceiver<Result<pbc::CoordinatorMessage, tonic::Status>>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = r.attach(
            &pbc::Register {
                protocol_version: 2,
                pid: 1,
                host: "127.0.0.1".into(),
                slots,
                name: String::new(),
            },
            tx,
            |id| pbc::CoordinatorMessage {
                msg: Some(pbc::coordinator_message::Msg::Registered(pbc::Registered {
                    worker_id: id.to_string(),
                    heartbeat_interval_ms: 500,
                })),
            },
        );
        (id, rx)
    }

    #[test]
    fn the_greeting_is_queued_before_the_worker_can_be_taken() {
        let r = Registry::new(Duration::from_secs(5));
        let (id, mut rx) = register(&r, 1);
        let first = rx
            .try_recv()
            .expect("greeting queued")
            .expect("not an error");
        assert!(
            matches!(first.msg, Some(pbc::coordinator_message::Msg::Registered(ref m)) if m.worker_id == id),
            "{first:?}"
        );
    }

    #[test]
    fn slots_are_taken_oldest_worker_first_and_given_back() {
        let r = Registry::new(Duration::from_secs(5));
        let (a, _ra) = register(&r, 1);
        let (b, _rb) = register(&r, 2);
        let (c, _rc) = register(&r, 1);
        assert!(r.acquire("j1", 4).is_none(), "only three workers");
        let got: Vec<String> = r
            .acquire("j1", 2)
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(got, vec![a.clone(), b.clone()]);
        // A job takes at most one slot per worker; b has one left, c one.
        let got: Vec<String> = r
            .acquire("j2", 2)
            .unwrap()
            .into_iter()
            .map(|w| w.id)
            .collect();
        assert_eq!(got, vec![b.clone(), c.clone()]);
        assert_eq!(r.free_workers(), 0);
        assert_eq!(r.free_for("j3"), 0);
        r.release("j1");
        assert_eq!(r.free_workers(), 2);
        assert_eq!(
            r.free_for("j2"),
            1,
            "a is free; b's free slot is no use to j2"
        );
    }

    #[test]
    fn a_lost_worker_is_reported_to_its_jobs_only() {
        let r = Registry::new(Duration::from_millis(0));
        let (a, _ra) = register(&r, 1);
        let (_b, _rb) = register(&r, 1);
        let (tx1, mut rx1) = mpsc::unbounded_channel();
        let (tx2, mut rx2) = mpsc::unbounded_channel();
        r.add_job("j1", tx1);
        r.add_job("j2", tx2);
        let w = r.acquire("j1", 1).unwrap();
        assert_eq!(w[0].id, a);
        r.deliver(&a, wm::Msg::Prepared(pbc::Prepared::default()));
        assert!(matches!(rx1.try_recv(), Ok(WorkerEvent::Message { .. })));
        std::thread::sleep(Duration::from_millis(2));
        r.reap();
        assert!(matches!(rx1.try_recv(), Ok(WorkerEvent::Lost { worker, .. }) if worker == a));
        assert!(rx2.try_recv().is_err(), "j2 used no worker");
        assert!(!r.is_attached(&a));
        assert!(r.view().is_empty(), "both timed out");
    }
}
