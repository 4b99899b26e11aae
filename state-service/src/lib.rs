//! state service
