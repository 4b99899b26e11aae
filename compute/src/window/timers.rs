//! Event-time and processing-time timers of one operator instance.

use std::collections::BTreeMap;

use crate::element::Timestamp;

/// Timers ordered by the time they fire at.
#[derive(Debug)]
pub struct TimerQueue<T> {
    by_time: BTreeMap<Timestamp, Vec<T>>,
    len: usize,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        Self {
            by_time: BTreeMap::new(),
            len: 0,
        }
    }
}

impl<T> TimerQueue<T> {
    /// Registers `timer` to fire once time reaches `at`.
    pub fn register(&mut self, at: Timestamp, timer: T) {
        self.by_time.entry(at).or_default().push(timer);
        self.len += 1;
    }

    /// Removes and returns every timer due at `now` (time `<= now`), in time order.
    pub fn pop_due(&mut self, now: Timestamp) -> Vec<(Timestamp, T)> {
        let later = match now.checked_add(1) {
            Some(next) => self.by_time.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.by_time, later);
        let out: Vec<_> = due
            .into_iter()
            .flat_map(|(t, timers)| timers.into_iter().map(move |x| (t, x)))
            .collect();
        self.len -= out.len();
        out
    }

    /// Number of registered timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is registered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_only_due_timers_in_order() {
        let mut q = TimerQueue::default();
        q.register(30, "c");
        q.register(10, "a");
        q.register(20, "b");
        q.register(10, "a2");
        assert_eq!(q.pop_due(20), vec![(10, "a"), (10, "a2"), (20, "b")]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_due(i64::MAX), vec![(30, "c")]);
        assert!(q.is_empty());
    }
}
