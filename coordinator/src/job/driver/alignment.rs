//! Watermark alignment across workers: for each worker with source tasks in an
//! alignment group, the smallest watermark of the group's tasks on the *other* workers,
//! announced to it when that changes. A worker combines it with its own tasks' live
//! watermarks, so tasks of one worker never wait on a round trip to align.
//!
//! Tasks that report no watermark (none yet, idle, finished) hold nobody back; where
//! none holds anything back the minimum is absent.

use super::*;

/// One announcement: to `worker`, the minimum of `group` elsewhere.
pub(super) type Announcement = (String, String, Option<i64>);

/// The alignment groups of one running attempt.
#[derive(Debug, Default)]
pub(super) struct Groups {
    /// Each source task's worker, group and watermark, from its worker's last report.
    tasks: BTreeMap<TaskId, (String, String, Option<i64>)>,
    /// The minimum last announced per (worker, group).
    announced: BTreeMap<(String, String), Option<i64>>,
}

impl Groups {
    /// Takes `worker`'s report; returns what to announce to whom.
    pub(super) fn update(
        &mut self,
        worker: &str,
        report: &pbc::SourceWatermarks,
    ) -> Vec<Announcement> {
        let mut touched = BTreeSet::new();
        for t in &report.tasks {
            let Some(task) = &t.task else { continue };
            self.tasks.insert(
                control::task_id(task),
                (worker.to_string(), t.group.clone(), t.watermark),
            );
            touched.insert(t.group.clone());
        }
        let mut out = Vec::new();
        for group in touched {
            let members: BTreeSet<&String> = self
                .tasks
                .values()
                .filter(|(_, g, _)| *g == group)
                .map(|(w, _, _)| w)
                .collect();
            for to in members {
                let min = self
                    .tasks
                    .values()
                    .filter(|(w, g, _)| *g == group && w != to)
                    .filter_map(|(_, _, wm)| *wm)
                    .min();
                let before = self.announced.insert((to.clone(), group.clone()), min);
                if before != Some(min) {
                    out.push((to.clone(), group.clone(), min));
                }
            }
        }
        out
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

    fn to(worker: &str, group: &str, min: Option<i64>) -> Announcement {
        (worker.into(), group.into(), min)
    }

    #[test]
    fn each_worker_hears_the_minimum_of_the_others_when_it_changes() {
        let mut g = Groups::default();
        // Worker a alone: nobody else holds its group back.
        assert_eq!(
            g.update("a", &report(&[(0, "g", Some(500))])),
            [to("a", "g", None)]
        );
        // Worker b's task is behind: a hears of it; b hears of a's.
        assert_eq!(
            g.update("b", &report(&[(1, "g", Some(100))])),
            [to("a", "g", Some(100)), to("b", "g", Some(500))]
        );
        // a moves on: b hears; a's view of the others did not change.
        assert_eq!(
            g.update("a", &report(&[(0, "g", Some(900))])),
            [to("b", "g", Some(900))]
        );
        // Nothing changed, nothing said.
        assert_eq!(g.update("a", &report(&[(0, "g", Some(900))])), []);
        // b goes idle: a reads freely.
        assert_eq!(
            g.update("b", &report(&[(1, "g", None)])),
            [to("a", "g", None)]
        );
        // Another group is its own.
        assert_eq!(
            g.update("b", &report(&[(2, "h", Some(7))])),
            [to("b", "h", None)]
        );
    }

    #[test]
    fn tasks_of_one_worker_are_left_to_it() {
        let mut g = Groups::default();
        assert_eq!(
            g.update("a", &report(&[(0, "g", Some(100)), (1, "g", Some(900))])),
            [to("a", "g", None)]
        );
    }
}
