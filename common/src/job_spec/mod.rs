//! YAML job specs (placeholder until the parser lands).
