//! The rendering tier of conveyor-worker: pages that need a browser. It is a crate of its own
//! so the plain worker's function links none of it. From the bottom up: [`browser_proxy`], the
//! forward proxy on loopback that every connection of the browser goes through; [`procs`],
//! the browser's processes; [`chromium`], one browser, started with every way around the
//! browser proxy closed; [`render`], one page in a context of its own, and [`served`], its
//! document as the site served it; [`fetcher`], the worker's
//! fetcher port answered by the browser; [`settings`], what the environment sets.

pub mod browser_proxy;
pub mod chromium;
pub mod fetcher;
pub mod procs;
pub mod render;
pub mod served;
pub mod settings;
