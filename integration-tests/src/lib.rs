//! End-to-end tests live in `tests/`; they run the real `sluice` binary.
