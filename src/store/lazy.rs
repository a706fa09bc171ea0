//! An SDK client built at its first use. So a cold start reaches its first `next` request
//! to the Lambda runtime without building clients, each of which parses its endpoint rules.
//! A sandbox still builds each client only once.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

/// A client, built the first time it is used and then kept. Clones share it.
pub struct Lazy<C> {
    built: Arc<OnceLock<C>>,
    make: Arc<dyn Fn() -> C + Send + Sync>,
}

impl<C> Lazy<C> {
    /// A client `make` builds at its first use.
    pub fn new(make: impl Fn() -> C + Send + Sync + 'static) -> Self {
        Self {
            built: Arc::new(OnceLock::new()),
            make: Arc::new(make),
        }
    }
}

impl<C: Clone + Send + Sync + 'static> From<C> for Lazy<C> {
    /// A client already built (tests, the operator's tool).
    fn from(client: C) -> Self {
        let built = OnceLock::new();
        let _ = built.set(client.clone());
        Self {
            built: Arc::new(built),
            make: Arc::new(move || client.clone()),
        }
    }
}

impl<C> Deref for Lazy<C> {
    type Target = C;

    fn deref(&self) -> &C {
        self.built.get_or_init(|| (self.make)())
    }
}

impl<C> Clone for Lazy<C> {
    fn clone(&self) -> Self {
        Self {
            built: self.built.clone(),
            make: self.make.clone(),
        }
    }
}

impl<C> fmt::Debug for Lazy<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lazy")
            .field("built", &self.built.get().is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_lazy_client_is_built_once_at_its_first_use_and_shared_by_clones() {
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let lazy = Lazy::new(move || counted.fetch_add(1, Ordering::Relaxed) + 100);
        let clone = lazy.clone();

        assert_eq!(
            builds.load(Ordering::Relaxed),
            0,
            "nothing built before a use"
        );
        assert_eq!((*clone, *lazy), (100, 100));
        assert_eq!(builds.load(Ordering::Relaxed), 1);
    }
}
