//! conveyor-worker's tooling as a library: the run progress simulation (`make bench`).

pub mod simulation;
