//! The task runtime: tasks, their queues, input gates, output routers and chains.
//!
//! - [`input_gate`]: merges a task's channels; watermark minimum, idleness, barriers.
//! - [`debloat`]: a gate's throughput, and buffer debloating of its channels.
//! - [`router`]: forward / hash / rebalance / broadcast partitioning of a task's output.
//! - [`chain`]: operators of one task called in sequence.
//! - [`task`]: the loop of one subtask.
//! - [`build`]: builds the tasks placed on this process, local and remote channels.
//! - [`tasks`]: runs the tasks built on this process; the first failure cancels the rest.
//! - [`metrics`]: job-wide counters for progress and benchmarks.
//! - [`alignment`]: source tasks that pause while their watermark is ahead of their group's.
//! - [`fault`]: a failure tests can ask a process to inject once.
//!
//! The byte-bounded channels between tasks are [`crate::queue`], below both this module
//! and the data plane. Nothing here knows what an operator computes, or where a source
//! reads from.

pub mod alignment;
pub mod build;
pub mod chain;
pub mod channel_state;
pub mod debloat;
pub mod fault;
pub mod input_gate;
pub mod metrics;
pub mod router;
pub mod task;
pub mod tasks;
