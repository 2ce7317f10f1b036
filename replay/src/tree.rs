//! A tournament tree over cache slots: the slot with the smallest [`Key`]
//! sits at the root, and changing one slot's key costs O(log C).

/// A priority: smaller is evicted first. `p` is the policy's score, `tie`
/// breaks equal scores (`last use step << 16 | expert id`: older, then lower
/// id, goes first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Key {
    /// Policy score (count, EMA value, minus the next use, ...).
    pub p: f64,
    /// Tie breaker.
    pub tie: u64,
}

impl Key {
    /// The score of an expert never requested yet.
    pub const UNSCORED: Key = Key { p: 0.0, tie: 0 };
    /// An empty slot: taken before any eviction.
    pub const FREE: Key = Key {
        p: f64::NEG_INFINITY,
        tie: 0,
    };
    /// A slot that must not be evicted during the current step.
    pub const PINNED: Key = Key {
        p: f64::INFINITY,
        tie: u64::MAX - 1,
    };
    /// Padding leaves past the capacity: never chosen.
    const PAD: Key = Key {
        p: f64::INFINITY,
        tie: u64::MAX,
    };

    /// The tie breaker for an expert last used at `step`.
    #[inline]
    pub fn tie(step: usize, expert: u16) -> u64 {
        ((step as u64) << 16) | u64::from(expert)
    }

    /// Strict order: score first, then tie breaker.
    #[inline]
    pub fn lt(self, other: Key) -> bool {
        self.p < other.p || (self.p == other.p && self.tie < other.tie)
    }
}

#[derive(Clone, Copy, Debug)]
struct Node {
    key: Key,
    slot: u32,
}

/// Min-tournament tree over `capacity` slots.
#[derive(Clone, Debug)]
pub struct Tree {
    capacity: usize,
    leaves: usize,
    nodes: Vec<Node>,
}

impl Tree {
    /// A tree of `capacity` free slots.
    pub fn new(capacity: usize) -> Tree {
        let leaves = capacity.max(1).next_power_of_two();
        let mut nodes = vec![
            Node {
                key: Key::PAD,
                slot: 0
            };
            2 * leaves
        ];
        for (i, n) in nodes[leaves..].iter_mut().enumerate() {
            n.slot = i as u32;
            if i < capacity {
                n.key = Key::FREE;
            }
        }
        let mut t = Tree {
            capacity,
            leaves,
            nodes,
        };
        t.rebuild();
        t
    }

    /// The slot with the smallest key, and that key.
    #[inline]
    pub fn min(&self) -> (usize, Key) {
        let n = self.nodes[1];
        (n.slot as usize, n.key)
    }

    /// The key stored for `slot`.
    #[inline]
    pub fn key(&self, slot: usize) -> Key {
        self.nodes[self.leaves + slot].key
    }

    /// Sets the key of `slot`.
    #[inline]
    pub fn set(&mut self, slot: usize, key: Key) {
        let mut i = self.leaves + slot;
        self.nodes[i].key = key;
        while i > 1 {
            let parent = i >> 1;
            let (a, b) = (self.nodes[2 * parent], self.nodes[2 * parent + 1]);
            self.nodes[parent] = if b.key.lt(a.key) { b } else { a };
            i = parent;
        }
    }

    /// Applies `f` to the key of every slot, then recomputes every winner.
    pub fn map_keys(&mut self, f: impl Fn(Key) -> Key) {
        for n in &mut self.nodes[self.leaves..self.leaves + self.capacity] {
            n.key = f(n.key);
        }
        self.rebuild();
    }

    fn rebuild(&mut self) {
        for i in (1..self.leaves).rev() {
            let (a, b) = (self.nodes[2 * i], self.nodes[2 * i + 1]);
            self.nodes[i] = if b.key.lt(a.key) { b } else { a };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: f64) -> Key {
        Key { p, tie: 0 }
    }

    #[test]
    fn root_tracks_the_smallest_key_through_updates() {
        let mut t = Tree::new(5);
        assert_eq!(t.min().1, Key::FREE);
        for (slot, p) in [3.0, 1.0, 4.0, 1.5, 9.0].into_iter().enumerate() {
            t.set(slot, key(p));
        }
        assert_eq!(t.min(), (1, key(1.0)));
        t.set(1, key(10.0));
        assert_eq!(t.min(), (3, key(1.5)));
        t.set(3, Key::PINNED);
        assert_eq!(t.min(), (0, key(3.0)));
        t.set(3, key(1.5));
        t.map_keys(|k| Key {
            p: -k.p,
            tie: k.tie,
        });
        assert_eq!(t.min(), (1, key(-10.0)));
    }

    #[test]
    fn equal_scores_fall_back_to_the_tie_breaker() {
        let mut t = Tree::new(2);
        t.set(0, Key { p: 1.0, tie: 7 });
        t.set(1, Key { p: 1.0, tie: 3 });
        assert_eq!(t.min().0, 1);
    }
}
