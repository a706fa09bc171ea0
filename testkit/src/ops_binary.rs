//! Where the tests find the `conveyor-ops` binary, which lives in a crate of its own.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The `conveyor-ops` binary of this build: `target/<profile>/conveyor-ops`, beside the
/// test binary's `deps/`. Cargo names a binary to the tests of its own package only
/// (`CARGO_BIN_EXE_...`), so the tests look for it here. `make test` builds it before the
/// tests (`cargo build --workspace --bins`). A binary missing, or older than a source file of
/// its crate or than the worker's library it links, fails the test with the command that
/// builds it, rather than testing old code.
pub fn ops_binary() -> PathBuf {
    // A test binary runs from target/<profile>/deps/; Cargo always puts it there.
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let binary = deps
        .parent()
        .expect("target/<profile>")
        .join("conveyor-ops");
    let fix = "build it first: cargo build --workspace --bins (make test does)";
    let built = modified(&binary).unwrap_or_else(|| panic!("no {}: {fix}", binary.display()));
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/ops/src");
    let newer = newer_source(&sources, built).or_else(|| newer_library(deps, built));
    if let Some(newer) = newer {
        panic!(
            "{} is older than {}: {fix}",
            binary.display(),
            newer.display()
        );
    }
    binary
}

/// The worker's library in `deps`, if one was built after `than`.
fn newer_library(deps: &Path, than: SystemTime) -> Option<PathBuf> {
    let entries = std::fs::read_dir(deps).ok()?;
    entries.flatten().map(|entry| entry.path()).find(|path| {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        name.starts_with("libconveyor_worker-")
            && name.ends_with(".rlib")
            && modified(path).is_some_and(|at| at > than)
    })
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// A `.rs` file under `dir` modified after `than`, if any.
fn newer_source(dir: &Path, than: SystemTime) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(newer) = newer_source(&path, than) {
                return Some(newer);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && modified(&path).is_some_and(|at| at > than)
        {
            return Some(path);
        }
    }
    None
}
