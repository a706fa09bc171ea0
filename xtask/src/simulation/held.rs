//! The queue's held-back records, by when they come back: buckets of 10 ms in time order
//! (a record returns at its bucket's end, at most 10 ms after its hold; within a bucket,
//! in no order). Cheaper than one heap over a million held records.

use std::collections::BTreeMap;

use super::dynamo::Micros;

/// A bucket's width.
const BUCKET: Micros = 10_000;

#[derive(Debug, Clone)]
pub(super) struct Held<T> {
    buckets: BTreeMap<Micros, Vec<T>>,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Self {
            buckets: BTreeMap::new(),
        }
    }
}

impl<T> Held<T> {
    /// `item` held until `ready` (rounded up to its bucket's end).
    pub(super) fn push(&mut self, ready: Micros, item: T) {
        self.buckets
            .entry(ready.div_ceil(BUCKET))
            .or_default()
            .push(item);
    }

    /// When the earliest held item comes back.
    pub(super) fn next_ready(&self) -> Option<Micros> {
        self.buckets.first_key_value().map(|(b, _)| b * BUCKET)
    }

    /// An item back by `now`, if any.
    pub(super) fn pop_ready(&mut self, now: Micros) -> Option<T> {
        let mut first = self.buckets.first_entry()?;
        if *first.key() * BUCKET > now {
            return None;
        }
        let item = first.get_mut().pop();
        if first.get().is_empty() {
            first.remove();
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_come_back_in_time_order_and_never_early() {
        let mut held = Held::default();
        held.push(25_000, 'b');
        held.push(3_000, 'a');
        held.push(29_999, 'c');

        assert_eq!(held.next_ready(), Some(10_000));
        assert_eq!(held.pop_ready(9_999), None);
        assert_eq!(held.pop_ready(10_000), Some('a'));
        assert_eq!(held.pop_ready(29_999), None);
        let mut late = [held.pop_ready(30_000), held.pop_ready(30_000)];
        late.sort();
        assert_eq!(late, [Some('b'), Some('c')]);
        assert_eq!(held.next_ready(), None);
    }
}
