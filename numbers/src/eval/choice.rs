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

pub use super::summary::{Binding, BudgetPicks, BudgetScope};

/// The checks a candidate must pass to fit a budget under `scope`: named
/// held-out figures (every domain and eval set with held-out positions, or
/// the pooled held-out split).
fn checks(c: &CandidateSummary, scope: BudgetScope) -> Vec<(String, &Figures)> {
    let Some(held) = c.splits.get(&Split::Heldout) else {
        return Vec::new();
    };
    match scope {
        BudgetScope::Pooled => [(POOLED.to_string(), &held.all)]
            .into_iter()
            .filter(|(_, f)| f.n > 0)
            .collect(),
        BudgetScope::EveryDomain => held
            .domains
            .iter()
            .filter(|(_, f)| f.n > 0)
            .map(|(d, f)| (d.clone(), f))
            .collect(),
    }
}

/// The name [`Binding::domain`] gives the pooled held-out split.
pub const POOLED: &str = "held-out (pooled)";

/// The check of `checks` nearest to (or furthest past) the budget: the
/// largest upper end, an unknown one (fewer than two clusters) first.
fn worst(checks: &[(String, &Figures)]) -> Option<(String, f64, u64)> {
    checks
        .iter()
        .map(|(d, f)| (d.clone(), f.kl.hi, f.clusters))
        .max_by(|a, b| {
            let key = |x: f64| if x.is_nan() { f64::INFINITY } else { x };
            key(a.1).total_cmp(&key(b.1))
        })
}

impl BudgetPicks {
    /// Picks, per method of `s`, the smallest evaluated K such that it and
    /// every larger evaluated K of the method fit `kl_budget`: every check
    /// of `scope` (each calibration domain's and eval set's held-out KL, or
    /// the pooled held-out KL) has a known 95% interval whose upper end is
    /// within the budget. Names the check that binds; never reads the fit
    /// split: without held-out positions nothing is picked and `message`
    /// says why.
    pub fn of(s: &EvalSummary, kl_budget: f64, scope: BudgetScope) -> BudgetPicks {
        let held_out = s
            .candidates
            .iter()
            .any(|c| !checks(c, BudgetScope::EveryDomain).is_empty());
        let mut by_method: BTreeMap<String, Vec<&CandidateSummary>> = BTreeMap::new();
        for c in &s.candidates {
            by_method.entry(c.method.clone()).or_default().push(c);
        }
        let mut picks = BTreeMap::new();
        let mut binding = BTreeMap::new();
        for (method, mut cs) in by_method {
            cs.sort_by_key(|c| std::cmp::Reverse(c.k));
            let mut pick: Option<&CandidateSummary> = None;
            let mut first_miss: Option<&CandidateSummary> = None;
            for c in held_out.then_some(&cs).into_iter().flatten() {
                let checks = checks(c, scope);
                let fits = !checks.is_empty()
                    && checks
                        .iter()
                        .all(|(_, f)| f.clusters >= 2 && f.kl.hi <= kl_budget);
                if !fits {
                    first_miss = Some(c);
                    break;
                }
                pick = Some(c);
            }
            let at = pick.or(first_miss);
            let bind = at.and_then(|c| {
                let (domain, hi, clusters) = worst(&checks(c, scope))?;
                Some(Binding {
                    candidate: c.name.clone(),
                    domain,
                    hi,
                    clusters,
                    missed: first_miss.map(|m| m.name.clone()),
                })
            });
            picks.insert(method.clone(), pick.map(|c| c.name.clone()));
            binding.insert(method, bind);
        }
        let unchecked: Vec<String> = s
            .domains
            .iter()
            .filter(|d| {
                !s.candidates.iter().any(|c| {
                    c.splits
                        .get(&Split::Heldout)
                        .and_then(|h| h.domains.get(*d))
                        .is_some_and(|f| f.n > 0)
                })
            })
            .cloned()
            .collect();
        BudgetPicks {
            kl_budget,
            split: Split::Heldout,
            scope,
            picks,
            binding,
            unchecked,
            message: (!held_out).then(|| {
                "no held-out positions were scored, so no K is picked (the fit split would judge the calibration text in-sample): set [corpus] heldout_fraction above 0, add an eval set, or evaluate with split = \"heldout\" or \"both\"".to_string()
            }),
        }
    }
}

impl EvalSummary {
    /// Records what `kl_budget` picks under `scope` (`budget`), when a
    /// budget is given.
    pub fn with_budget(mut self, kl_budget: Option<f64>, scope: BudgetScope) -> EvalSummary {
        self.budget = kl_budget.map(|b| BudgetPicks::of(&self, b, scope));
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

    fn figures(mean: f64, hi: f64, clusters: u64) -> Figures {
        Figures {
            n: 100,
            chunks: 4,
            clusters,
            kl: KlFigures {
                mean,
                hi,
                ..KlFigures::default()
            },
            ..Figures::default()
        }
    }

    /// A candidate whose pooled held-out KL and whose one domain's
    /// (`english`) have mean `mean` and upper end `hi`, over 4 clusters.
    fn candidate(name: &str, k: u32, bytes: u64, mean: f64, hi: f64) -> CandidateSummary {
        CandidateSummary {
            name: name.into(),
            method: crate::keep_name::method_of(name).into(),
            k,
            sha256: String::new(),
            splits: BTreeMap::from([(
                Split::Heldout,
                SplitFigures {
                    all: figures(mean, hi, 4),
                    domains: BTreeMap::from([("english".into(), figures(mean, hi, 4))]),
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
            domains: vec!["english".into()],
            pairs: Vec::new(),
            generation_noise: None,
            generation_unprompted: BTreeMap::new(),
        }
    }

    fn picks(s: EvalSummary, budget: f64, scope: BudgetScope) -> BudgetPicks {
        s.with_budget(Some(budget), scope).budget.unwrap()
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
        ]);
        let b = picks(s, 0.1, BudgetScope::EveryDomain);
        assert_eq!(b.split, Split::Heldout);
        // frequency_K4's mean fits but its upper bound does not.
        assert_eq!(b.picks["frequency"].as_deref(), Some("frequency_K8"));
        assert_eq!(b.picks["reap_hybrid"].as_deref(), Some("reap_hybrid_K4"));
        assert_eq!(b.picks["reap_mean"], None);
        let bind = b.binding["frequency"].as_ref().unwrap();
        assert_eq!(
            (bind.candidate.as_str(), bind.domain.as_str(), bind.hi),
            ("frequency_K8", "english", 0.09)
        );
        assert_eq!(bind.missed.as_deref(), Some("frequency_K4"));
        assert!(b.message.is_none() && b.unchecked.is_empty());
    }

    #[test]
    fn a_k_that_fits_below_one_that_misses_is_not_picked() {
        // K8 fits, K12 misses, K16 fits: only K16 holds with every larger K.
        let s = summary(vec![
            candidate("frequency_K8", 8, 80, 0.02, 0.04),
            candidate("frequency_K12", 12, 120, 0.05, 0.2),
            candidate("frequency_K16", 16, 160, 0.01, 0.03),
        ]);
        let b = picks(s, 0.1, BudgetScope::EveryDomain);
        assert_eq!(b.picks["frequency"].as_deref(), Some("frequency_K16"));
        let bind = b.binding["frequency"].as_ref().unwrap();
        assert_eq!(bind.missed.as_deref(), Some("frequency_K12"));
    }

    #[test]
    fn every_domain_must_fit_unless_the_pooled_figure_is_asked_for() {
        // A small domain that K4 wrecks, hidden in a pooled figure that fits.
        let mut k4 = candidate("frequency_K4", 4, 40, 0.03, 0.05);
        let held = k4.splits.get_mut(&Split::Heldout).unwrap();
        held.domains.insert("japanese".into(), figures(0.4, 0.9, 3));
        let mut k8 = candidate("frequency_K8", 8, 80, 0.01, 0.02);
        let held = k8.splits.get_mut(&Split::Heldout).unwrap();
        held.domains
            .insert("japanese".into(), figures(0.03, 0.07, 3));
        let mut s = summary(vec![k4, k8]);
        s.domains.extend(["japanese".into(), "chat".into()]);
        let b = picks(s.clone(), 0.1, BudgetScope::EveryDomain);
        assert_eq!(b.picks["frequency"].as_deref(), Some("frequency_K8"));
        let bind = b.binding["frequency"].as_ref().unwrap();
        assert_eq!((bind.domain.as_str(), bind.hi), ("japanese", 0.07));
        // A domain without held-out positions is named, not dropped unseen.
        assert_eq!(b.unchecked, ["chat"]);
        assert_eq!(BudgetScope::parse("pooled"), Ok(BudgetScope::Pooled));
        let err = BudgetScope::parse("worst").unwrap_err();
        assert!(
            err.contains("every_domain") && err.contains("pooled"),
            "{err}"
        );
        let pooled = picks(s, 0.1, BudgetScope::Pooled);
        assert_eq!(pooled.picks["frequency"].as_deref(), Some("frequency_K4"));
        let bind = pooled.binding["frequency"].as_ref().unwrap();
        assert_eq!((bind.domain.as_str(), bind.hi), (POOLED, 0.05));
    }

    #[test]
    fn a_figure_of_one_cluster_never_fits_a_budget() {
        let mut c = candidate("frequency_K4", 4, 40, 0.0, f64::NAN);
        let held = c.splits.get_mut(&Split::Heldout).unwrap();
        held.domains.get_mut("english").unwrap().clusters = 1;
        let b = picks(summary(vec![c]), 1.0, BudgetScope::EveryDomain);
        assert_eq!(b.picks["frequency"], None);
        let bind = b.binding["frequency"].as_ref().unwrap();
        assert_eq!((bind.domain.as_str(), bind.clusters), ("english", 1));
        assert!(bind.hi.is_nan());
    }

    #[test]
    fn without_held_out_positions_nothing_is_picked_and_the_summary_says_why() {
        let mut c = candidate("frequency_K4", 4, 40, 0.01, 0.02);
        let held = c.splits.remove(&Split::Heldout).unwrap();
        c.splits.insert(Split::Fit, held);
        let b = picks(summary(vec![c]), 1.0, BudgetScope::EveryDomain);
        assert_eq!(b.picks["frequency"], None);
        assert!(b.binding["frequency"].is_none());
        assert!(b.message.unwrap().contains("no held-out positions"));
        assert_eq!(b.split, Split::Heldout);
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
