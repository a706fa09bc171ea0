//! Coping with push-back: a write that meets a concurrent one is tried again ([`retry`]), a
//! record sent back to the queue waits a growing, jittered time ([`backoff`]), and a sandbox
//! that AWS throttles takes fewer records at once ([`pressure`]).

pub mod backoff;
pub mod pressure;
pub mod retry;
