//! A response body read under its cap, in a buffer that never grows much past the bytes read.

use bytes::Bytes;

/// A body being read. It never holds more than the cap, and its buffer is never much larger
/// than the bytes read. A `BytesMut` left to grow doubles its capacity, so a page just over
/// half the cap would hold a buffer of twice the cap while its last chunk is copied in.
#[derive(Debug)]
pub struct CappedBody {
    bytes: Vec<u8>,
    cap: usize,
}

/// The body passed its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverCap;

impl CappedBody {
    /// A body expected to be `declared` bytes (0 when unknown), at most `cap`.
    pub fn new(declared: u64, cap: u64) -> Self {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        let declared = usize::try_from(declared).unwrap_or(usize::MAX);
        Self {
            bytes: Vec::with_capacity(declared.min(cap)),
            cap,
        }
    }

    /// Appends a chunk, growing the buffer at most to the cap.
    pub fn extend(&mut self, chunk: &[u8]) -> Result<(), OverCap> {
        let needed = self.bytes.len() + chunk.len();
        if needed > self.cap {
            return Err(OverCap);
        }
        if needed > self.bytes.capacity() {
            let grown = (self.bytes.capacity() * 2).clamp(needed, self.cap);
            self.bytes.reserve_exact(grown - self.bytes.len());
        }
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }

    /// Fills the body to `first` bytes from `chunk` (the chunk that passed the cap).
    pub fn fill(&mut self, chunk: &[u8], first: u64) {
        let room = usize::try_from(first)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&chunk[..room.min(chunk.len())]);
    }

    pub fn capacity(&self) -> usize {
        self.bytes.capacity()
    }

    /// The bytes read, without a copy.
    pub fn into_bytes(self) -> Bytes {
        Bytes::from(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_of_unknown_length_never_holds_a_buffer_over_its_cap() {
        let cap = 10 * 1024 * 1024;
        let mut body = CappedBody::new(0, cap as u64);

        for _ in 0..(cap / 8192) {
            body.extend(&[7; 8192]).unwrap();
            assert!(body.capacity() <= cap, "capacity {}", body.capacity());
        }

        assert_eq!(body.into_bytes().len(), cap);
    }

    #[test]
    fn a_body_past_its_cap_is_refused_before_it_grows() {
        let mut body = CappedBody::new(0, 10_000);

        assert_eq!(body.extend(&[1; 6000]), Ok(()));
        assert_eq!(body.extend(&[1; 6000]), Err(OverCap));
        assert!(body.capacity() <= 10_000);
    }

    #[test]
    fn a_declared_length_is_reserved_once_up_to_the_cap() {
        assert_eq!(CappedBody::new(4096, 10_000).capacity(), 4096);
        assert!(CappedBody::new(u64::MAX, 10_000).capacity() <= 10_000);
    }
}
