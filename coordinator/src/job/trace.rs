//! One trace per deploy, failover and rescale of a job: a root span from the moment
//! the job leaves a steady state (submitted, a task failed, a rescale asked for) until
//! it runs again (or ends), with a child span per lifecycle phase it went through
//! (`scheduling`, `failing`, `restarting`, `rescaling`: a rescale's checkpoint, cancel
//! and redeploy all happen in `rescaling`) and, under the phase, the state service
//! calls the actor made for it (`open state`, `roll back state`, `find restore
//! point`).
//!
//! It watches the lifecycle state the driver publishes and must not change what the
//! actor does: the driver does not know traces exist. Spans go to the global tracer;
//! without an exporter every call is a no-op.

use opentelemetry::{Context, KeyValue};
use sluice_telemetry::trace;

use super::lifecycle::JobState;
use super::status::JobStatus;

/// The trace of the job's current change, while one is under way.
struct Open {
    root: Context,
    phase: Option<(JobState, Context)>,
}

/// The lifecycle traces of one job.
#[derive(Default)]
pub(crate) struct LifecycleTraces {
    last: Option<JobState>,
    open: Option<Open>,
}

/// The span a phase of the lifecycle is traced as.
fn phase_name(state: JobState) -> Option<&'static str> {
    match state {
        JobState::Scheduling => Some("scheduling"),
        JobState::Failing => Some("failing"),
        JobState::Restarting => Some("restarting"),
        JobState::Rescaling => Some("rescaling"),
        _ => None,
    }
}

impl LifecycleTraces {
    /// Takes note of the job's status: a change of its lifecycle state opens, moves on
    /// or ends the trace.
    pub(crate) fn observe(&mut self, status: &JobStatus) {
        let state = status.state;
        let before = self.last.replace(state);
        if before == Some(state) {
            return;
        }
        if self.open.is_none() {
            let kind = match (before, state) {
                (_, JobState::Scheduling) => Some("deploy"),
                (_, JobState::Failing | JobState::Restarting) => Some("failover"),
                (_, JobState::Rescaling) => Some("rescale"),
                _ => None,
            };
            if let Some(kind) = kind {
                let mut attributes = vec![
                    KeyValue::new("sluice.job_id", status.id.clone()),
                    KeyValue::new("sluice.job_name", status.name.clone()),
                    KeyValue::new("sluice.attempt", status.attempt as i64),
                    KeyValue::new("sluice.parallelism", i64::from(status.parallelism)),
                ];
                if let Some(f) = &status.failure {
                    attributes.push(KeyValue::new("sluice.failure", f.clone()));
                }
                self.open = Some(Open {
                    root: trace::start(kind, &Context::new(), attributes, None),
                    phase: None,
                });
            }
        }
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if let Some((_, cx)) = open.phase.take() {
            trace::end(&cx, None, None);
        }
        match state {
            JobState::Running => self.finish(status, None),
            s if s.is_terminal() => {
                let error = (s != JobState::Finished).then(|| format!("the job ended {s}"));
                self.finish(status, error)
            }
            s => {
                open.phase = phase_name(s).map(|name| {
                    (
                        s,
                        trace::start(
                            name,
                            &open.root,
                            vec![KeyValue::new("sluice.attempt", status.attempt as i64)],
                            None,
                        ),
                    )
                });
            }
        }
    }

    /// A child span `name` of the current phase (or of the root between phases), while
    /// a change is traced.
    pub(crate) fn child(&self, name: &'static str) -> Option<Context> {
        let open = self.open.as_ref()?;
        let parent = open.phase.as_ref().map_or(&open.root, |(_, cx)| cx);
        Some(trace::start(name, parent, Vec::new(), None))
    }

    fn finish(&mut self, status: &JobStatus, error: Option<String>) {
        if let Some(open) = self.open.take() {
            trace::set_attribute(
                &open.root,
                KeyValue::new("sluice.running_attempt", status.attempt as i64),
            );
            trace::set_attribute(
                &open.root,
                KeyValue::new("sluice.running_parallelism", i64::from(status.parallelism)),
            );
            trace::end(&open.root, None, error);
        }
    }
}
