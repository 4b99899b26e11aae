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
use tokio::sync::watch;

use crate::element::Timestamp;

/// What a source task reports while it does not hold its group back.
const NONE: i64 = Timestamp::MIN;

#[derive(Debug)]
struct Member {
    task: (u32, u32),
    group: String,
    /// The task's watermark while it counts for the group's minimum; [`NONE`] otherwise.
    watermark: AtomicI64,
}

/// The aligned source tasks of one deployment attempt on this worker.
#[derive(Debug, Default)]
pub struct Alignment {
    groups: Mutex<HashMap<String, watch::Sender<Option<i64>>>>,
    members: Mutex<Vec<Arc<Member>>>,
    interval: Mutex<Option<Duration>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Alignment {
    /// Joins source task `task` to the group `spec` names.
    pub fn join(&self, task: (u32, u32), spec: &pb::WatermarkAlignment) -> SourceAlignment {
        let min = lock(&self.groups)
            .entry(spec.group.clone())
            .or_insert_with(|| watch::channel(None).0)
            .subscribe();
        let member = Arc::new(Member {
            task,
            group: spec.group.clone(),
            watermark: AtomicI64::new(NONE),
        });
        lock(&self.members).push(member.clone());
        let every = Duration::from_millis(spec.update_interval_ms.max(1));
        let mut interval = lock(&self.interval);
        *interval = Some(interval.map_or(every, |i| i.min(every)));
        SourceAlignment {
            member,
            max_drift: spec.max_drift_ms.min(i64::MAX as u64) as i64,
            min,
        }
    }

    /// How often the tasks' watermarks are reported: the shortest interval any group
    /// asked for; `None` while no task is aligned.
    pub fn update_interval(&self) -> Option<Duration> {
        *lock(&self.interval)
    }

    /// The coordinator's newest minimum of `group` (`None`: no task holds it back).
    pub fn announce(&self, group: &str, min: Option<i64>) {
        if let Some(tx) = lock(&self.groups).get(group) {
            tx.send_if_modified(|v| {
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
        let now: Vec<_> = lock(&self.members)
            .iter()
            .map(|m| {
                let w = m.watermark.load(Ordering::Relaxed);
                (m.task, m.group.clone(), (w != NONE).then_some(w))
            })
            .collect();
        (!now.is_empty()).then_some(now)
    }
}

/// An aligned source task, its group and its watermark (`None`: holds nobody back).
pub type Reported = ((u32, u32), String, Option<i64>);

/// One source task's part in its alignment group.
#[derive(Debug)]
pub struct SourceAlignment {
    member: Arc<Member>,
    max_drift: i64,
    min: watch::Receiver<Option<i64>>,
}

impl SourceAlignment {
    /// The task's watermark, `None` while it does not hold the group back (none yet,
    /// idle, finished).
    pub fn set(&self, watermark: Option<Timestamp>) {
        let w = watermark.filter(|w| *w != NONE).unwrap_or(NONE);
        self.member.watermark.store(w, Ordering::Relaxed);
    }

    /// Whether a task at `watermark` may read on: it is at most `max_drift` ahead of
    /// the group's minimum (always, before the coordinator announced one).
    pub fn allows(&mut self, watermark: Timestamp) -> bool {
        match *self.min.borrow_and_update() {
            Some(min) => watermark <= min.saturating_add(self.max_drift),
            None => true,
        }
    }

    /// Resolves when the group's minimum changes (never once the attempt is gone).
    pub async fn changed(&mut self) {
        if self.min.changed().await.is_err() {
            std::future::pending::<()>().await;
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
        assert!(a.allows(1_000_000), "nothing announced: read on");
        hub.announce("g", Some(1_000));
        assert!(a.allows(1_100));
        assert!(!a.allows(1_101));
        assert!(b.allows(1_101), "another group's minimum does not apply");
        hub.announce("g", None);
        assert!(a.allows(5_000), "no task holds the group back");
        assert_eq!(hub.update_interval(), Some(Duration::from_millis(200)));
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
    async fn an_announcement_wakes_the_paused_task() {
        let hub = Arc::new(Alignment::default());
        let mut a = hub.join((0, 0), &spec("g", 10, 100));
        hub.announce("g", Some(0));
        assert!(!a.allows(50));
        let h = hub.clone();
        tokio::spawn(async move { h.announce("g", Some(45)) });
        tokio::time::timeout(Duration::from_secs(5), a.changed())
            .await
            .expect("woken");
        assert!(a.allows(50));
    }
}
