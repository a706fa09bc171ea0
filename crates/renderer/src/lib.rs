//! The rendering tier of conveyor-worker (issue #53), being built as a crate of its own so the
//! plain worker's function links none of it. So far: [`guard`], the forward proxy on loopback
//! that every connection of the browser goes through, so the browser reaches nothing the
//! plain fetch may not.

pub mod guard;
