//! Choosing what to ship from an evaluation: per method, the smallest
//! evaluated K whose held-out KL fits a budget (its interval's upper end,
//! so the choice holds with 95% confidence), and the size-versus-KL Pareto
//! front (no other file is both smaller and closer to the base model).

use super::summary::{CandidateSummary, EvalSummary, Figures};
use crate::split::Split;
use std::collections::BTreeMap;

/// The split whose KL the choices read: held-out when it was scored,
/// else fit.
pub fn basis(s: &EvalSummary) -> Split {
    let held = s
        .candidates
        .iter()
        .any(|c| c.splits.get(&Split::Heldout).is_some_and(|f| f.all.n > 0));
    if held {
        Split::Heldout
    } else {
        Split::Fit
    }
}

/// A candidate's whole-split figures in `split`, when it scored positions
/// there.
pub fn figures_in(c: &CandidateSummary, split: Split) -> Option<&Figures> {
    c.splits.get(&split).map(|f| &f.all).filter(|f| f.n > 0)
}

pub use super::summary::BudgetPicks;

impl BudgetPicks {
    /// Picks, per method of `s`, the smallest evaluated K whose upper end
    /// of the KL interval is at most `kl_budget`. A figure from fewer than
    /// two chunks has no interval and never fits.
    pub fn of(s: &EvalSummary, kl_budget: f64) -> BudgetPicks {
        let split = basis(s);
        let mut picks: BTreeMap<String, Option<(u32, String)>> = BTreeMap::new();
        for c in &s.candidates {
            let entry = picks.entry(c.method.clone()).or_default();
            let fits = figures_in(c, split).is_some_and(|f| f.chunks >= 2 && f.kl.hi <= kl_budget);
            if fits && entry.as_ref().is_none_or(|(k, _)| c.k < *k) {
                *entry = Some((c.k, c.name.clone()));
            }
        }
        BudgetPicks {
            kl_budget,
            split,
            picks: picks
                .into_iter()
                .map(|(m, p)| (m, p.map(|(_, name)| name)))
                .collect(),
        }
    }
}

impl EvalSummary {
    /// Records what `kl_budget` picks (`budget`), when one is given.
    pub fn with_budget(mut self, kl_budget: Option<f64>) -> EvalSummary {
        self.budget = kl_budget.map(|b| BudgetPicks::of(&self, b));
        self
    }
}

/// Which of `points` (bytes, KL) are on the Pareto front: no other point
/// is at most as large and at most as far from the base model, and
/// strictly better in one of the two.
pub fn pareto_front(points: &[(u64, f64)]) -> Vec<bool> {
    points
        .iter()
        .map(|&(b, kl)| {
            !points
                .iter()
                .any(|&(b2, kl2)| b2 <= b && kl2 <= kl && (b2 < b || kl2 < kl))
        })
        .collect()
}

/// The names of the candidates of `s` on its size-versus-KL Pareto front
/// (those with a known size and a figure in [`basis`]'s split), in the
/// summary's order.
pub fn front_names(s: &EvalSummary) -> Vec<String> {
    let split = basis(s);
    let sized: Vec<(&CandidateSummary, u64, f64)> = s
        .candidates
        .iter()
        .filter_map(|c| Some((c, c.bytes?, figures_in(c, split)?.kl.mean)))
        .collect();
    let points: Vec<(u64, f64)> = sized.iter().map(|&(_, b, kl)| (b, kl)).collect();
    sized
        .iter()
        .zip(pareto_front(&points))
        .filter(|(_, on)| *on)
        .map(|((c, _, _), _)| c.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::summary::SplitFigures;
    use crate::eval::KlFigures;

    fn candidate(name: &str, k: u32, bytes: u64, mean: f64, hi: f64) -> CandidateSummary {
        let all = Figures {
            n: 100,
            chunks: 4,
            kl: KlFigures {
                mean,
                hi,
                ..KlFigures::default()
            },
            ..Figures::default()
        };
        CandidateSummary {
            name: name.into(),
            method: crate::keep_name::method_of(name).into(),
            k,
            sha256: String::new(),
            splits: BTreeMap::from([(
                Split::Heldout,
                SplitFigures {
                    all,
                    ..SplitFigures::default()
                },
            )]),
            bytes: Some(bytes),
            generation: None,
        }
    }

    fn summary(candidates: Vec<CandidateSummary>) -> EvalSummary {
        EvalSummary {
            base_sha256: String::new(),
            corpus_sha256: String::new(),
            skip_first: 0,
            n_chunks: 4,
            backends: Vec::new(),
            uncertainty: String::new(),
            candidates,
            budget: None,
            eval_sets: Vec::new(),
        }
    }

    #[test]
    fn the_budget_picks_the_smallest_k_whose_upper_bound_fits() {
        let s = summary(vec![
            candidate("frequency_K4", 4, 40, 0.08, 0.12),
            candidate("frequency_K8", 8, 80, 0.04, 0.09),
            candidate("frequency_K12", 12, 120, 0.01, 0.02),
            candidate("reap_hybrid_K4", 4, 40, 0.05, 0.08),
            candidate("reap_hybrid_K8", 8, 80, 0.02, 0.03),
            candidate("reap_mean_K8", 8, 80, 0.2, 0.3),
        ])
        .with_budget(Some(0.1));
        let b = s.budget.unwrap();
        assert_eq!(b.split, Split::Heldout);
        // frequency_K4's mean fits but its upper bound does not.
        assert_eq!(b.picks["frequency"].as_deref(), Some("frequency_K8"));
        assert_eq!(b.picks["reap_hybrid"].as_deref(), Some("reap_hybrid_K4"));
        assert_eq!(b.picks["reap_mean"], None);
    }

    #[test]
    fn a_figure_of_one_chunk_never_fits_a_budget() {
        let mut c = candidate("frequency_K4", 4, 40, 0.0, 0.0);
        c.splits.get_mut(&Split::Heldout).unwrap().all.chunks = 1;
        let b = summary(vec![c]).with_budget(Some(1.0)).budget.unwrap();
        assert_eq!(b.picks["frequency"], None);
    }

    #[test]
    fn the_front_keeps_exactly_the_undominated_files() {
        let s = summary(vec![
            candidate("frequency_K4", 4, 40, 0.08, 0.1),
            candidate("reap_hybrid_K4", 4, 40, 0.05, 0.1),
            candidate("frequency_K8", 8, 80, 0.06, 0.1),
            candidate("reap_hybrid_K8", 8, 80, 0.02, 0.1),
            candidate("frequency_K12", 12, 120, 0.03, 0.1),
            candidate("reap_hybrid_K12", 12, 120, 0.01, 0.1),
        ]);
        assert_eq!(
            front_names(&s),
            ["reap_hybrid_K4", "reap_hybrid_K8", "reap_hybrid_K12"]
        );
        // Equal points dominate neither; a larger one with equal KL is out.
        assert_eq!(
            pareto_front(&[(1, 0.5), (1, 0.5), (2, 0.5), (3, 0.1)]),
            [true, true, false, true]
        );
    }
}
