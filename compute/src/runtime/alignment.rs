//! Watermark alignment (Flink's `withWatermarkAlignment`): a source subtask whose
//! watermark is more than `max_drift` ahead of the smallest watermark of its alignment
//! group stops reading until the others catch up.
//!
//! Without it, sources that read at different speeds drift apart in event time, and
//! every window pane the faster ones fill stays open until the slowest catches up:
//! state grows with the drift, in any backend, and each barrier makes all of it durable.
//!
//! One [`Alignment`] per deployment attempt on a worker holds the attempt's aligned
//! source tasks ([`SourceAlignment`]) and the group minimums the coordinator last
//! announced. The worker's session reports the tasks' watermarks
//! ([`Alignment::report`]) and hands the coordinator's minimums in
//! ([`Alignment::announce`]); the coordinator takes the minimum across workers. This
//! module knows nothing of the coordinator or the wire: a task only compares its
//! watermark with the group's minimum.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_common::pb;
use tokio::sync::{Notify, watch};

use crate::element::Timestamp;

/// What a source task reports while it does not hold its group back.
const NONE: i64 = Timestamp::MIN;

#[derive(Debug)]
struct Member {
    task: (u32, u32),
    /// The task's watermark while it counts for the group's minimum; [`NONE`] otherwise.
    watermark: AtomicI64,
    /// The watermark the last report carried.
    reported: AtomicI64,
}

impl Member {
    fn watermark(&self) -> Option<i64> {
        let w = self.watermark.load(Ordering::Relaxed);
        (w != NONE).then_some(w)
    }
}

/// One alignment group's tasks on this worker.
#[derive(Debug)]
struct Group {
    /// The smallest watermark of the group's tasks on other workers, as the coordinator
    /// last announced it.
    others: watch::Sender<Option<i64>>,
    members: Mutex<Vec<Arc<Member>>>,
    /// Wakes paused members when a member here moved: the group's minimum on this
    /// worker is read live, not from the coordinator's last announcement, so sources
    /// of one worker never wait for a round trip to align with each other.
    moved: Notify,
}

impl Group {
    /// The smallest watermark of the group's members here and elsewhere.
    fn minimum(&self, others: Option<i64>) -> Option<i64> {
        let here = lock(&self.members)
            .iter()
            .filter_map(|m| m.watermark())
            .min();
        match (here, others) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The aligned source tasks of one deployment attempt on this worker.
#[derive(Debug, Default)]
pub struct Alignment {
    groups: Mutex<HashMap<String, Arc<Group>>>,
    interval: Mutex<Option<Duration>>,
    /// Wakes the reporter early: a task paused, or moved half its drift since the
    /// last report (the other workers' view of it must not lag by a whole interval).
    due: Arc<Notify>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An aligned source task, its group and its watermark (`None`: holds nobody back).
pub type Reported = ((u32, u32), String, Option<i64>);

impl Alignment {
    /// Joins source task `task` to the group `spec` names.
    pub fn join(&self, task: (u32, u32), spec: &pb::WatermarkAlignment) -> SourceAlignment {
        let group = lock(&self.groups)
            .entry(spec.group.clone())
            .or_insert_with(|| {
                Arc::new(Group {
                    others: watch::channel(None).0,
                    members: Mutex::default(),
                    moved: Notify::new(),
                })
            })
            .clone();
        let member = Arc::new(Member {
            task,
            watermark: AtomicI64::new(NONE),
            reported: AtomicI64::new(NONE),
        });
        lock(&group.members).push(member.clone());
        let every = Duration::from_millis(spec.update_interval_ms.max(1));
        {
            let mut interval = lock(&self.interval);
            *interval = Some(interval.map_or(every, |i| i.min(every)));
        }
        // The reporter sleeps until a task is aligned.
        self.due.notify_one();
        SourceAlignment {
            member,
            others: group.others.subscribe(),
            group,
            max_drift: spec.max_drift_ms.min(i64::MAX as u64) as i64,
            due: self.due.clone(),
            is_paused: false,
        }
    }

    /// How often the tasks' watermarks are reported: the shortest interval any group
    /// asked for; `None` while no task is aligned.
    pub fn update_interval(&self) -> Option<Duration> {
        *lock(&self.interval)
    }

    /// Resolves when a report is due before the interval: a task joined, paused, or
    /// moved half its drift since the last report.
    pub async fn due(&self) {
        self.due.notified().await
    }

    /// The coordinator's newest minimum of `group` on the other workers (`None`: none
    /// holds it back there).
    pub fn announce(&self, group: &str, min: Option<i64>) {
        if let Some(g) = lock(&self.groups).get(group) {
            g.others.send_if_modified(|v| {
                let changed = *v != min;
                *v = min;
                changed
            });
        }
    }

    /// Every aligned task's (task, group, watermark); `None` while no task is aligned.
    /// Sent whole every interval, changed or not: a report the coordinator dropped (it
    /// came before the attempt counted as running) must not leave a task that holds
    /// its group back unknown there.
    pub fn report(&self) -> Option<Vec<Reported>> {
        let groups = lock(&self.groups);
        let mut now: Vec<Reported> = groups
            .iter()
            .flat_map(|(name, g)| {
                lock(&g.members)
                    .iter()
                    .map(|m| {
                        let w = m.watermark();
                        m.reported.store(w.unwrap_or(NONE), Ordering::Relaxed);
                        (m.task, name.clone(), w)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        now.sort();
        (!now.is_empty()).then_some(now)
    }
}

/// One source task's part in its alignment group.
#[derive(Debug)]
pub struct SourceAlignment {
    member: Arc<Member>,
    group: Arc<Group>,
    others: watch::Receiver<Option<i64>>,
    max_drift: i64,
    due: Arc<Notify>,
    /// The last [`Self::allows`] said no.
    is_paused: bool,
}

impl SourceAlignment {
    /// The task's watermark, `None` while it does not hold the group back (none yet,
    /// idle, finished).
    pub fn set(&self, watermark: Option<Timestamp>) {
        let w = watermark.filter(|w| *w != NONE).unwrap_or(NONE);
        if self.member.watermark.swap(w, Ordering::Relaxed) == w {
            return;
        }
        self.group.moved.notify_waiters();
        let reported = self.member.reported.load(Ordering::Relaxed);
        if w != NONE && (reported == NONE || w.saturating_sub(reported) >= self.max_drift / 2) {
            self.due.notify_one();
        }
    }

    /// Whether a task at `watermark` may read on: it is at most `max_drift` ahead of
    /// the group's minimum (here and on the other workers, as last announced). When it
    /// starts pausing the worker's reporter is woken: workers that wait on each other's
    /// last reports must not wait a whole interval for the next.
    pub fn allows(&mut self, watermark: Timestamp) -> bool {
        let others = *self.others.borrow_and_update();
        let allowed = match self.group.minimum(others) {
            Some(min) => watermark <= min.saturating_add(self.max_drift),
            None => true,
        };
        if !allowed && !self.is_paused {
            self.due.notify_one();
        }
        self.is_paused = !allowed;
        allowed
    }

    /// Resolves when the group's minimum may have moved: a member here moved, or the
    /// coordinator announced the other workers' (never once the attempt is gone).
    pub async fn changed(&mut self) {
        tokio::select! {
            changed = self.others.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            () = self.group.moved.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(group: &str, drift: u64, every: u64) -> pb::WatermarkAlignment {
        pb::WatermarkAlignment {
            group: group.into(),
            max_drift_ms: drift,
            update_interval_ms: every,
        }
    }

    #[test]
    fn a_task_more_than_the_drift_ahead_of_its_groups_minimum_pauses() {
        let hub = Alignment::default();
        let mut a = hub.join((0, 0), &spec("g", 100, 500));
        let mut b = hub.join((0, 1), &spec("other", 100, 200));
        assert!(a.allows(1_000_000), "nothing known: read on");
        hub.announce("g", Some(1_000));
        assert!(a.allows(1_100));
        assert!(!a.allows(1_101));
        assert!(b.allows(1_101), "another group's minimum does not apply");
        hub.announce("g", None);
        assert!(a.allows(5_000), "no task holds the group back");
        assert_eq!(hub.update_interval(), Some(Duration::from_millis(200)));
    }

    #[test]
    fn tasks_of_one_worker_align_on_their_live_watermarks() {
        let hub = Alignment::default();
        let mut a = hub.join((0, 0), &spec("g", 100, 500));
        let b = hub.join((0, 1), &spec("g", 100, 500));
        b.set(Some(1_000));
        a.set(Some(1_200));
        assert!(
            !a.allows(1_200),
            "b here is behind, whatever the coordinator said"
        );
        b.set(Some(1_150));
        assert!(a.allows(1_200));
        hub.announce("g", Some(900));
        assert!(
            !a.allows(1_200),
            "a task on another worker is further behind"
        );
        b.set(None);
        hub.announce("g", None);
        assert!(a.allows(1_300), "a alone holds the group");
    }

    #[test]
    fn reports_name_every_task_and_its_watermark() {
        let hub = Alignment::default();
        assert_eq!(hub.report(), None, "no aligned task");
        let a = hub.join((3, 0), &spec("g", 100, 500));
        let b = hub.join((3, 1), &spec("g", 100, 500));
        a.set(Some(7));
        b.set(None);
        assert_eq!(
            hub.report(),
            Some(vec![
                ((3, 0), "g".to_string(), Some(7)),
                ((3, 1), "g".to_string(), None)
            ])
        );
        b.set(Some(Timestamp::MIN));
        assert_eq!(hub.report().unwrap()[1].2, None, "MIN is no watermark");
        b.set(Some(9));
        assert_eq!(hub.report().unwrap()[1].2, Some(9));
    }

    #[tokio::test]
    async fn a_report_is_due_early_when_a_task_moved_half_its_drift_or_paused() {
        let hub = Alignment::default();
        let mut a = hub.join((0, 0), &spec("g", 100, 60_000));
        let due = |hub: &Alignment| futures::FutureExt::now_or_never(hub.due()).is_some();
        assert!(due(&hub), "a task joined: the reporter starts");
        a.set(Some(1_000));
        assert!(due(&hub), "a first watermark");
        hub.report();
        a.set(Some(1_049));
        assert!(!due(&hub), "less than half the drift");
        a.set(Some(1_050));
        assert!(due(&hub), "half the drift");
        hub.report();
        hub.announce("g", Some(0));
        assert!(!a.allows(1_050));
        assert!(due(&hub), "paused");
        assert!(!a.allows(1_050));
        assert!(!due(&hub), "once per pause");
    }

    #[tokio::test]
    async fn an_announcement_wakes_the_paused_task() {
        let hub = Arc::new(Alignment::default());
        let mut a = hub.join((0, 0), &spec("g", 10, 100));
        let b = hub.join((0, 1), &spec("g", 10, 100));
        hub.announce("g", Some(0));
        assert!(!a.allows(50));
        let h = hub.clone();
        tokio::spawn(async move { h.announce("g", Some(45)) });
        tokio::time::timeout(Duration::from_secs(5), a.changed())
            .await
            .expect("woken by the coordinator");
        assert!(a.allows(50));
        b.set(Some(20));
        assert!(!a.allows(50));
        let waiting = tokio::spawn(async move {
            a.changed().await;
            a.allows(50)
        });
        tokio::task::yield_now().await;
        b.set(Some(40));
        let allowed = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken by a task here")
            .unwrap();
        assert!(allowed);
    }
}
