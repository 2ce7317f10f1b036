//! The generation check (issue #44): teacher-forced KL can miss what a
//! pruned model does when it generates (REAP's own finding), so each
//! candidate also continues held-out prompts greedily, and its tokens are
//! compared with the base model's continuation of the same prompt.
//!
//! The coordinator picks the prompts ([`GenerateJob`]: the first chunks of
//! each domain's held-out split, by id); a worker evaluating a lease with
//! such a chunk decodes its first `prompt_tokens` tokens in the base model
//! and in every candidate and takes `new_tokens` greedy tokens from each
//! (the argmax, first of equal maxima, without stopping at an end token),
//! and records per candidate one [`Generation`]: where the two
//! continuations first differ and how many of their positions agree.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the workers generate: the prompts, by chunk id with the chunk's
/// domain, and the lengths. No prompts: no generation check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerateJob {
    /// Prompt chunks (id to domain index): each chunk's first
    /// `prompt_tokens` tokens are a prompt.
    pub prompts: BTreeMap<u32, u16>,
    /// Tokens of each prompt.
    pub prompt_tokens: u32,
    /// Greedy tokens generated after it by each model.
    pub new_tokens: u32,
}

impl GenerateJob {
    /// Whether the job generates anything.
    pub fn is_empty(&self) -> bool {
        self.prompts.is_empty() || self.new_tokens == 0
    }

    /// (prompt tokens, new tokens) as every eval partial of the job
    /// records them: (0, 0) when the job generates nothing.
    pub fn tokens(&self) -> (u32, u32) {
        match self.is_empty() {
            true => (0, 0),
            false => (self.prompt_tokens, self.new_tokens),
        }
    }
}

/// A candidate's greedy continuation of one prompt against the base
/// model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// Domain index of the prompt's chunk.
    pub domain: u16,
    /// Positions of the continuations where both models generated the
    /// same token.
    pub agreed: u32,
    /// The first position where the continuations differ;
    /// [`GenerateJob::new_tokens`] when they never do.
    pub diverged_at: u32,
}

impl Generation {
    /// Compares two continuations of one prompt, position by position.
    pub fn of(domain: u16, base: &[i32], candidate: &[i32]) -> Generation {
        let same: Vec<bool> = base.iter().zip(candidate).map(|(a, b)| a == b).collect();
        Generation {
            domain,
            agreed: same.iter().filter(|&&s| s).count() as u32,
            diverged_at: same.iter().position(|&s| !s).unwrap_or(same.len()) as u32,
        }
    }

    /// Whether the figures are possible for continuations of `new_tokens`:
    /// every position before the first difference agrees, and no count
    /// exceeds the length.
    pub fn check(&self, new_tokens: u32) -> Result<(), String> {
        let fits = self.agreed <= new_tokens
            && self.diverged_at <= new_tokens
            && self.agreed >= self.diverged_at
            && (self.diverged_at == new_tokens) == (self.agreed == new_tokens);
        match fits {
            true => Ok(()),
            false => Err(format!(
                "generation figures (agreed {}, diverged at {}) are impossible for {new_tokens} new tokens",
                self.agreed, self.diverged_at
            )),
        }
    }
}

/// The generation check's figures over a set of prompts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationFigures {
    /// Prompts continued.
    pub prompts: u64,
    /// Share of generated positions where the candidate's token is the base
    /// model's.
    pub agreement: f64,
    /// Mean position of the first difference (`new_tokens` for a prompt
    /// whose continuations are identical).
    pub first_divergence_mean: f64,
    /// Prompts whose continuations are identical.
    pub identical: u64,
}

impl GenerationFigures {
    /// The figures of `gens`, continuations of `new_tokens` each.
    pub fn of<'a>(gens: impl Iterator<Item = &'a Generation>, new_tokens: u32) -> Self {
        let (mut prompts, mut agreed, mut diverged, mut identical) = (0u64, 0u64, 0u64, 0u64);
        for g in gens {
            prompts += 1;
            agreed += u64::from(g.agreed);
            diverged += u64::from(g.diverged_at);
            identical += u64::from(g.diverged_at == new_tokens);
        }
        if prompts == 0 {
            return GenerationFigures::default();
        }
        GenerationFigures {
            prompts,
            agreement: agreed as f64 / (prompts * u64::from(new_tokens).max(1)) as f64,
            first_divergence_mean: diverged as f64 / prompts as f64,
            identical,
        }
    }
}

/// A candidate's generation check in `eval/summary.json`: over every
/// prompt, and per domain name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationSummary {
    /// Tokens of each prompt.
    pub prompt_tokens: u32,
    /// Greedy tokens generated after each prompt.
    pub new_tokens: u32,
    /// Every prompt.
    pub all: GenerationFigures,
    /// Per domain name.
    pub domains: BTreeMap<String, GenerationFigures>,
}

impl GenerationSummary {
    /// The summary of a candidate's generations (by chunk); `None` without
    /// any. `domains` names the domain indices.
    pub fn of(
        gens: &BTreeMap<u32, Generation>,
        job: (u32, u32),
        domains: &[String],
    ) -> Option<GenerationSummary> {
        if gens.is_empty() {
            return None;
        }
        let (prompt_tokens, new_tokens) = job;
        let mut by_domain: BTreeMap<u16, Vec<&Generation>> = BTreeMap::new();
        for g in gens.values() {
            by_domain.entry(g.domain).or_default().push(g);
        }
        let domains = by_domain
            .into_iter()
            .map(|(d, gs)| {
                let name = domains
                    .get(d as usize)
                    .cloned()
                    .unwrap_or_else(|| format!("domain {d}"));
                (name, GenerationFigures::of(gs.into_iter(), new_tokens))
            })
            .collect();
        Some(GenerationSummary {
            prompt_tokens,
            new_tokens,
            all: GenerationFigures::of(gens.values(), new_tokens),
            domains,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuations_compare_position_by_position() {
        let g = Generation::of(1, &[5, 6, 7, 8], &[5, 6, 9, 8]);
        assert_eq!((g.domain, g.agreed, g.diverged_at), (1, 3, 2));
        assert!(g.check(4).is_ok());
        let same = Generation::of(0, &[1, 2, 3], &[1, 2, 3]);
        assert_eq!((same.agreed, same.diverged_at), (3, 3));
        assert!(same.check(3).is_ok());
        let at_once = Generation::of(0, &[1, 2, 3], &[4, 5, 6]);
        assert_eq!((at_once.agreed, at_once.diverged_at), (0, 0));
    }

    #[test]
    fn impossible_figures_are_refused() {
        for (agreed, diverged_at) in [(5, 2), (1, 2), (4, 2), (2, 4)] {
            let g = Generation {
                domain: 0,
                agreed,
                diverged_at,
            };
            assert!(g.check(4).is_err(), "{agreed} {diverged_at}");
        }
    }

    #[test]
    fn figures_average_over_prompts_and_split_by_domain() {
        let gens: BTreeMap<u32, Generation> = [
            (3, Generation::of(0, &[1, 2, 3, 4], &[1, 2, 3, 4])),
            (9, Generation::of(0, &[1, 2, 3, 4], &[1, 9, 3, 9])),
            (12, Generation::of(1, &[1, 2, 3, 4], &[9, 9, 9, 9])),
        ]
        .into();
        let names = ["english".to_string(), "code".to_string()];
        let s = GenerationSummary::of(&gens, (8, 4), &names).unwrap();
        assert_eq!((s.all.prompts, s.all.identical), (3, 1));
        assert!((s.all.agreement - 6.0 / 12.0).abs() < 1e-12);
        assert!((s.all.first_divergence_mean - 5.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.domains["english"].prompts, 2);
        assert_eq!(s.domains["code"].agreement, 0.0);
        assert!(GenerationSummary::of(&BTreeMap::new(), (8, 4), &names).is_none());
    }
}
