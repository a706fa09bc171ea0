//! The rendering tier's tests, one binary with a module per behaviour: the egress guard
//! alone (`guard`), and a real Chromium rendering local sites through it (`browser`).

mod browser;
mod guard;
mod sites;
