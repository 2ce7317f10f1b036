//! Tables with one entry per possible expert id (ids are `u16`), so that
//! indexing by an id is in bounds by construction and the per-request loops of
//! the replay engines carry no bounds checks. A layer's ids use only the first
//! `n_expert` entries; the rest are never touched.

/// Number of possible expert ids.
pub const ID_SPACE: usize = 1 << 16;

/// One `T` per possible expert id.
pub struct IdTable<T>(Box<[T; ID_SPACE]>);

impl<T: Copy> IdTable<T> {
    /// A table with every entry `fill`.
    pub fn new(fill: T) -> Self {
        let entries = vec![fill; ID_SPACE].into_boxed_slice();
        IdTable(entries.try_into().ok().expect("one entry per u16 id"))
    }

    /// The entry of expert `e` (an expert id, so below 2^16).
    #[inline]
    pub fn get(&self, e: usize) -> T {
        debug_assert!(e < ID_SPACE, "expert id {e} is not a u16");
        self.0[e % ID_SPACE]
    }

    /// The entry of expert `e`, for update.
    #[inline]
    pub fn get_mut(&mut self, e: u16) -> &mut T {
        &mut self.0[e as usize]
    }

    /// Every entry, as a slice.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.0[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_u16_id_has_its_own_entry() {
        let mut t = IdTable::new(0u32);
        *t.get_mut(0) = 1;
        *t.get_mut(u16::MAX) = 2;
        assert_eq!((t.get(0), t.get(1), t.get(ID_SPACE - 1)), (1, 0, 2));
        assert_eq!(t.as_mut_slice().iter().filter(|v| **v != 0).count(), 2);
    }
}
