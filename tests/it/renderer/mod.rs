//! The renderer (crates/renderer): its browser proxy alone (`browser_proxy`), a real Chromium
//! rendering local sites through it (`browser`), and the renderer running the worker's
//! pipeline against the emulator (`pipeline`); `sites`: what they stand up on loopback.

mod browser;
mod browser_proxy;
mod pipeline;
mod sites;
