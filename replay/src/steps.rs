//! Flat request arrays: a layer's tokens ([`TokenReqs`]) and the cache steps
//! built from them ([`Steps`]), one token (decode-like) or one ubatch
//! (prefill-like) per step.

/// Marks an empty request slot (a forced miss) or an empty near-pick slot.
pub const NONE: u16 = u16::MAX;

/// The experts each token of one layer asks for, `k` slots per token.
///
/// A slot holding [`NONE`] is a forced miss: a keep map left fewer than `k`
/// kept experts in the token's router top-N.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenReqs {
    /// Experts of the layer (ids are below this).
    pub n_expert: usize,
    /// Slots per token.
    pub k: usize,
    /// Near-pick slots per token (experts ranked after the requested ones).
    pub n_near: usize,
    /// Chunk of each token; a ubatch never spans two chunks.
    pub chunk: Vec<u32>,
    /// Requested experts, `k` per token, [`NONE`] for a forced miss.
    pub expert: Vec<u16>,
    /// Router probability of each requested expert.
    pub prob: Vec<f32>,
    /// 1-based rank of each requested expert in the router's top-N.
    pub rank: Vec<u16>,
    /// Near picks, `n_near` per token, [`NONE`]-padded.
    pub near: Vec<u16>,
}

impl TokenReqs {
    /// Number of tokens.
    pub fn tokens(&self) -> usize {
        self.chunk.len()
    }

    /// Forced misses: slots that hold no expert.
    pub fn forced(&self) -> u64 {
        self.expert.iter().filter(|&&e| e == NONE).count() as u64
    }
}

/// A layer's requests grouped into steps. Within a step every expert appears
/// once (first-occurrence order) with its credits summed over the step's tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Steps {
    /// Experts of the layer.
    pub n_expert: usize,
    /// Tokens covered.
    pub tokens: u64,
    /// Forced misses of those tokens (no expert to request).
    pub forced: u64,
    /// Step `s` holds requests `start[s]..start[s + 1]`.
    pub start: Vec<u32>,
    /// Distinct experts of each step.
    pub expert: Vec<u16>,
    /// Uses of the expert in the step (tokens that requested it).
    pub uses: Vec<f32>,
    /// Router probability summed over those tokens.
    pub prob: Vec<f32>,
    /// `1 / rank` summed over those tokens.
    pub inv_rank: Vec<f32>,
    /// Step `s` holds near picks `near_start[s]..near_start[s + 1]`.
    pub near_start: Vec<u32>,
    /// Distinct near-picked experts of each step.
    pub near: Vec<u16>,
    /// Times each was near-picked in the step.
    pub near_uses: Vec<f32>,
}

impl Steps {
    /// Number of steps.
    pub fn len(&self) -> usize {
        self.start.len().saturating_sub(1)
    }

    /// Whether there are no steps.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cache requests (distinct experts per step, summed).
    pub fn requests(&self) -> u64 {
        self.expert.len() as u64
    }

    /// Requests of step `s`, as a range into the flat arrays.
    #[inline]
    pub fn range(&self, s: usize) -> std::ops::Range<usize> {
        self.start[s] as usize..self.start[s + 1] as usize
    }

    /// Steps that request more distinct experts than `capacity` (at
    /// capacity 0, every step with a request).
    pub fn overflow_steps(&self, capacity: usize) -> u64 {
        (0..self.len())
            .filter(|&s| self.range(s).len() > capacity)
            .count() as u64
    }

    /// Near picks of step `s`, as a range into the near arrays.
    #[inline]
    pub fn near_range(&self, s: usize) -> std::ops::Range<usize> {
        self.near_start[s] as usize..self.near_start[s + 1] as usize
    }

    /// Groups tokens into steps of at most `ubatch` consecutive tokens of one
    /// chunk (`ubatch == 1`: one token per step).
    pub fn build(t: &TokenReqs, ubatch: usize) -> Steps {
        let ubatch = ubatch.max(1);
        let mut s = Steps {
            n_expert: t.n_expert,
            tokens: t.tokens() as u64,
            forced: t.forced(),
            start: vec![0],
            near_start: vec![0],
            ..Steps::default()
        };
        s.expert.reserve(t.expert.len());
        // Where each expert sits in the current step, valid while stamp == step + 1.
        let mut stamp = vec![0u32; t.n_expert];
        let mut at = vec![0u32; t.n_expert];
        let mut near_stamp = vec![0u32; t.n_expert];
        let mut near_at = vec![0u32; t.n_expert];
        let mut first = 0;
        let mut step = 1u32;
        while first < t.tokens() {
            let mut end = first + 1;
            while end < t.tokens() && end - first < ubatch && t.chunk[end] == t.chunk[first] {
                end += 1;
            }
            for tok in first..end {
                for j in tok * t.k..(tok + 1) * t.k {
                    let e = t.expert[j];
                    if e == NONE {
                        continue;
                    }
                    let ei = e as usize;
                    let credit_rank = 1.0 / f32::from(t.rank[j].max(1));
                    if stamp[ei] == step {
                        let i = at[ei] as usize;
                        s.uses[i] += 1.0;
                        s.prob[i] += t.prob[j];
                        s.inv_rank[i] += credit_rank;
                    } else {
                        stamp[ei] = step;
                        at[ei] = s.expert.len() as u32;
                        s.expert.push(e);
                        s.uses.push(1.0);
                        s.prob.push(t.prob[j]);
                        s.inv_rank.push(credit_rank);
                    }
                }
                for &e in &t.near[tok * t.n_near..(tok + 1) * t.n_near] {
                    if e == NONE {
                        continue;
                    }
                    let ei = e as usize;
                    if near_stamp[ei] == step {
                        s.near_uses[near_at[ei] as usize] += 1.0;
                    } else {
                        near_stamp[ei] = step;
                        near_at[ei] = s.near.len() as u32;
                        s.near.push(e);
                        s.near_uses.push(1.0);
                    }
                }
            }
            s.start.push(s.expert.len() as u32);
            s.near_start.push(s.near.len() as u32);
            step += 1;
            first = end;
        }
        s
    }

    /// For every request, the next step that requests the same expert
    /// (`self.len()` when none does): Belady's next-use index.
    pub fn next_use(&self) -> Vec<u32> {
        let never = self.len() as u32;
        let mut next_seen = vec![never; self.n_expert];
        let mut next = vec![never; self.expert.len()];
        for s in (0..self.len()).rev() {
            for i in self.range(s) {
                let e = self.expert[i] as usize;
                next[i] = next_seen[e];
                next_seen[e] = s as u32;
            }
        }
        next
    }
}
