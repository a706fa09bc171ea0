//! The rendering tier's tests, one binary with a module per behaviour: the egress guard
//! alone (`guard`), a real Chromium rendering local sites through it (`browser`), and the
//! renderer running the worker's pipeline against the emulator (`pipeline`).

mod browser;
mod guard;
mod pipeline;
mod sites;
