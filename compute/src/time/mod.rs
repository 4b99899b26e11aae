//! Event time at the sources: bounded out-of-orderness watermarks per split.
//!
//! The minimum across a task's inputs and idleness downstream are the input gate's job
//! (`runtime::input_gate`); windows and lateness are `operator::window`'s.

pub mod watermark;
