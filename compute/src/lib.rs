//! Compute.
