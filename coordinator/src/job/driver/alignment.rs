//! Watermark alignment across workers: the smallest watermark of each alignment
//! group's source tasks, announced to every worker of the attempt when it changes.
//!
//! Tasks that report no watermark (none yet, idle, finished) hold nobody back; a group
//! where none holds anything back has no minimum, and its sources read freely.

use super::*;

/// The alignment groups of one running attempt.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Each source task's group and watermark, from its worker's last report.
    tasks: BTreeMap<TaskId, (String, Option<i64>)>,
    /// The minimum last announced per group.
    announced: BTreeMap<String, Option<i64>>,
}

impl Groups {
    /// Takes a worker's report; returns the groups whose minimum changed and the new
    /// minimum of each.
    pub(super) fn update(&mut self, report: &pbc::SourceWatermarks) -> Vec<(String, Option<i64>)> {
        let mut touched = BTreeSet::new();
        for t in &report.tasks {
            let Some(task) = &t.task else { continue };
            self.tasks
                .insert(control::task_id(task), (t.group.clone(), t.watermark));
            touched.insert(t.group.clone());
        }
        touched
            .into_iter()
            .filter_map(|group| {
                let min = self
                    .tasks
                    .values()
                    .filter(|(g, _)| *g == group)
                    .filter_map(|(_, w)| *w)
                    .min();
                let before = self.announced.insert(group.clone(), min);
                (before != Some(min)).then_some((group, min))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(tasks: &[(u32, &str, Option<i64>)]) -> pbc::SourceWatermarks {
        pbc::SourceWatermarks {
            attempt: 1,
            tasks: tasks
                .iter()
                .map(|(subtask, group, watermark)| pbc::SourceWatermark {
                    task: Some(pbc::TaskRef {
                        node: 0,
                        subtask: *subtask,
                        source: true,
                    }),
                    group: group.to_string(),
                    watermark: *watermark,
                })
                .collect(),
        }
    }

    #[test]
    fn the_minimum_spans_workers_and_is_announced_only_when_it_changes() {
        let mut g = Groups::default();
        // Worker A's task 0 first: the only one that reported.
        assert_eq!(
            g.update(&report(&[(0, "g", Some(500))])),
            [("g".into(), Some(500))]
        );
        // Worker B's task 1 is behind: the minimum drops to it.
        assert_eq!(
            g.update(&report(&[(1, "g", Some(100))])),
            [("g".into(), Some(100))]
        );
        // A moves on: the minimum does not change, nothing to announce.
        assert_eq!(g.update(&report(&[(0, "g", Some(900))])), []);
        // B goes idle: A alone holds the group.
        assert_eq!(
            g.update(&report(&[(1, "g", None)])),
            [("g".into(), Some(900))]
        );
        // A finishes too: nobody holds the group back.
        assert_eq!(g.update(&report(&[(0, "g", None)])), [("g".into(), None)]);
        // Another group is its own.
        assert_eq!(
            g.update(&report(&[(2, "h", Some(7))])),
            [("h".into(), Some(7))]
        );
        assert_eq!(g.update(&report(&[(2, "h", Some(7))])), []);
    }
}
