//! The simulation's clock: simulated time in microseconds.

/// Simulated time, in microseconds.
pub type Micros = u64;

/// One second of simulated time.
pub const SECOND: Micros = 1_000_000;
