//! The operator's routines, one file each, each given only the stores it uses; what
//! `conveyor-ops` (src/bin) runs.

pub mod local_mapping;
pub mod progress;
pub mod replay;
pub mod requeue;
pub mod results;
pub mod submit;
