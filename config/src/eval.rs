//! `[eval]` of the run config: which keep maps `coordinator run` evaluates
//! after scoring, and which positions are scored. A candidate's K may be a
//! share of the model's experts (`frequency_K50%`, or `methods` x `k` with
//! `k = ["50%", "75%"]`), so one config fits every model; shares resolve
//! against the run's `saliency.json` ([`KeepShape`]).

use super::method::CandidateMethod;
use numbers::eval::{BudgetScope, ModelsInMemory};
use numbers::keep_name::{self, KeepMapName};
use numbers::routing::{check_group_keep, ExpertGroups};
use numbers::saliency::Saliency;
use numbers::Splits;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[eval]`: the keep maps `coordinator run` evaluates after scoring (none:
/// no evaluation), and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSettings {
    /// Keep maps by name, `<method>_K<k>`; K may be a share (`_K50%`).
    pub keep_maps: Vec<String>,
    /// Scoring methods whose keep maps at every size of `k` are evaluated
    /// too (after `keep_maps`, method by method); `<method>_merge`
    /// (`reap_hybrid_merge`) evaluates the method's merge plans
    /// (`<method>_merge_K<k>`, which `score` writes beside its keep maps).
    #[schemars(with = "Vec<String>")]
    pub methods: Vec<CandidateMethod>,
    /// Sizes for `methods`: a number of experts (`"8"`) or a share of the
    /// model's experts (`"50%"`).
    pub k: Vec<String>,
    /// Splits scored: `fit`, `heldout` or `both`.
    #[schemars(with = "String")]
    pub split: Splits,
    /// Positions skipped at the start of every chunk; absent: half the
    /// chunk (`n_ctx / 2`), the positions llama-perplexity scores, so
    /// figures compare with its; 0 scores every position.
    pub skip_first: Option<u32>,
    /// A KL budget (mean KL(base || candidate) in nats): per method, the
    /// smallest evaluated K such that it and every larger evaluated K fit
    /// is picked (in `eval/summary.json` and the report); a K fits when the
    /// upper end of each held-out KL interval `budget_scope` names is
    /// within the budget. Never read from the fit split.
    pub kl_budget: Option<f64>,
    /// Which held-out figures must fit `kl_budget`: `"every_domain"` (each
    /// calibration domain and eval set; the summary names the one that
    /// binds) or `"pooled"` (the whole held-out split).
    #[schemars(with = "String")]
    pub budget_scope: BudgetScope,
    /// Models each worker holds in memory at once: `"auto"` (every model
    /// when they fit in the free memory where the weights go, else the base
    /// and one candidate, else one), `"all"`, or a number: 2 is the base and
    /// one candidate, 1 one model at a time. Fewer than 1 + n run the
    /// candidates in turn against the base model's kept logits, with the
    /// same figures and forward passes.
    #[schemars(with = "String")]
    pub models_in_memory: ModelsInMemory,
    /// Where workers write sliced candidates and a lease's base logits (a
    /// path on each worker's machine; unset: its `$TMPDIR`).
    pub scratch_dir: Option<String>,
    /// The generation check: prompts per calibration domain and eval set
    /// that the base model and every candidate continue greedily, each from
    /// a held-out document of its own: a chat document's tokens up to an
    /// assistant turn's start (the first that leaves room for the
    /// continuation), another document's first `n_ctx / 2` tokens; 0: no
    /// check.
    pub generate_prompts: u32,
    /// Greedy tokens each model generates after a prompt (at most half
    /// the chunk).
    pub generate_tokens: u32,
    /// The generation check's noise floor: the base model continues each
    /// prompt a second time with the prompt decoded in micro-batches of
    /// this many tokens (fewer than `[run] n_ubatch`; 1: token by token, a
    /// decode step per prompt token), a change that should not matter; its
    /// disagreement with itself is the table's `base vs base` row. 0: no
    /// noise floor.
    pub generate_noise_ubatch: u32,
}

impl Default for EvalSettings {
    fn default() -> Self {
        EvalSettings {
            keep_maps: Vec::new(),
            methods: Vec::new(),
            k: Vec::new(),
            split: Splits::Both,
            skip_first: None,
            kl_budget: None,
            budget_scope: BudgetScope::EveryDomain,
            models_in_memory: ModelsInMemory::Auto,
            scratch_dir: None,
            generate_prompts: 4,
            generate_tokens: 32,
            generate_noise_ubatch: 1,
        }
    }
}

/// What a keep-map size is resolved against: the model's experts per layer,
/// experts per token and routing groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepShape {
    /// Routed experts per MoE layer.
    pub n_expert: u32,
    /// Experts selected per token.
    pub n_expert_used: u32,
    /// Group-limited routing, if the model has it.
    pub groups: Option<ExpertGroups>,
}

/// A keep-map size as written: a number of experts or a share of them.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Size {
    Experts(u32),
    Percent(f64),
}

/// Parses `"12"` or `"50%"`; the error says what a size looks like.
fn parse_size(spec: &str) -> Result<Size, String> {
    let spec = spec.trim();
    match spec.strip_suffix('%') {
        Some(pct) => pct
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|p| p.is_finite() && *p > 0.0 && *p <= 100.0)
            .map(Size::Percent)
            .ok_or_else(|| "a share must be a number in (0, 100] before the %".to_string()),
        None => spec
            .parse::<u32>()
            .ok()
            .filter(|&k| k > 0)
            .map(Size::Experts)
            .ok_or_else(|| "not a positive number of experts or a share like \"50%\"".to_string()),
    }
}

impl KeepShape {
    /// The shape `saliency.json` describes.
    pub fn of(s: &Saliency) -> KeepShape {
        KeepShape {
            n_expert: s.n_expert,
            n_expert_used: s.n_expert_used,
            groups: s.routing.groups,
        }
    }

    /// Resolves a size: `"12"` as it is, `"50%"` as that share of the
    /// experts rounded down (to a multiple of the routing groups under
    /// grouped routing, as `score`'s default sizes are). A size outside
    /// `n_expert_used..=n_expert`, or one grouped routing cannot run
    /// ([`check_group_keep`]), is refused with why.
    pub fn resolve(&self, spec: &str) -> Result<u32, String> {
        let n = self.n_expert;
        let (k, from) = self.sized(spec)?;
        if k > n {
            return Err(format!(
                "{from}{k} experts is more than the model's {n} per layer"
            ));
        }
        if k < self.n_expert_used {
            return Err(format!(
                "{from}keeping {k} experts is fewer than the {} the model routes each token to (llama.cpp cannot run it)",
                self.n_expert_used
            ));
        }
        check_group_keep(self.groups, n, self.n_expert_used, k)
            .map_err(|e| format!("{from}{e}"))?;
        Ok(k)
    }

    /// The number of experts a size names (`"12"`, or `"50%"` of the
    /// experts rounded down as [`KeepShape::resolve`] rounds it), without
    /// checking that the model can run it: `score`'s `--k`, whose own
    /// check allows maps `eval` cannot run.
    pub fn count(&self, spec: &str) -> Result<u32, String> {
        self.sized(spec).map(|(k, _)| k)
    }

    /// A size's number of experts and, for a share, how it was computed
    /// (a prefix for messages).
    fn sized(&self, spec: &str) -> Result<(u32, String), String> {
        let n = self.n_expert;
        Ok(match parse_size(spec)? {
            Size::Experts(k) => (k, String::new()),
            Size::Percent(pct) => {
                let step = self.groups.map_or(1, |g| g.n_group.max(1));
                // The epsilon keeps 75% of 12 at 9 despite rounding.
                let k = (f64::from(n) * pct / 100.0 + 1e-9).floor() as u32 / step * step;
                let rounding = if step > 1 {
                    format!(", rounded down to a multiple of the {step} routing groups")
                } else {
                    String::new()
                };
                (
                    k,
                    format!("{pct}% of the model's {n} experts is {k}{rounding}; "),
                )
            }
        })
    }
}

/// Refuses a KL budget that is not a positive finite number.
pub fn check_kl_budget(budget: f64) -> Result<(), String> {
    if budget.is_finite() && budget > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "{budget} is not a positive number of nats (a mean KL such as 0.05)"
        ))
    }
}

/// The size part of a keep-map name `<method>_K<size>` whose size is a
/// share (ends with `%`), if it is one.
fn share_spec(name: &str) -> Option<Result<(&str, &str), String>> {
    name.ends_with('%').then(|| {
        keep_name::split(name)
            .ok_or_else(|| format!("keep map {name:?}: a share needs the form <method>_K<share>%"))
    })
}

impl EvalSettings {
    /// Whether `coordinator run` evaluates anything (an incomplete
    /// `methods` / `k` pair counts, so it is refused, not ignored).
    pub fn is_configured(&self) -> bool {
        !self.keep_maps.is_empty() || !self.methods.is_empty() || !self.k.is_empty()
    }

    /// Whether a candidate's name needs the model's shape to resolve (a K
    /// given as a share, or sizes for `methods`).
    pub fn needs_shape(&self) -> bool {
        !self.methods.is_empty()
            || !self.k.is_empty()
            || self.keep_maps.iter().any(|n| share_spec(n).is_some())
    }

    /// Positions skipped at the start of every chunk of `n_ctx` tokens:
    /// `skip_first`, else half the chunk (llama-perplexity's).
    pub fn skip_first_of(&self, n_ctx: u32) -> u32 {
        self.skip_first.unwrap_or(n_ctx / 2)
    }

    /// Checks what can be checked without the model: `methods` and `k`
    /// given together, known methods, sizes that parse, a positive KL
    /// budget. Errors name the entry.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(b) = self.kl_budget {
            check_kl_budget(b).map_err(|e| format!("[eval] kl_budget: {e}"))?;
        }
        if self.methods.is_empty() != self.k.is_empty() {
            return Err("[eval] methods and k go together: give both or neither".into());
        }
        for spec in &self.k {
            parse_size(spec).map_err(|e| format!("[eval] k {spec:?}: {e}"))?;
        }
        for name in &self.keep_maps {
            if let Some(parts) = share_spec(name) {
                parse_size(parts?.1).map_err(|e| format!("keep map {name:?}: {e}"))?;
            }
        }
        Ok(())
    }

    /// Refuses merge methods (`<method>_merge`) and merge plans by name on
    /// a run that collects no routing traces (`[run]
    /// trace_tokens_per_split = 0`), from which `score` builds the plans.
    pub fn check_merge_traces(&self, trace_tokens_per_split: u64) -> Result<(), String> {
        if trace_tokens_per_split > 0 {
            return Ok(());
        }
        let merged = self
            .methods
            .iter()
            .filter(|m| m.merged)
            .map(|m| format!("[eval] methods {:?}", m.name()))
            .chain(
                self.keep_maps
                    .iter()
                    .filter(|n| crate::candidate::is_merge_plan(n))
                    .map(|n| format!("[eval] keep_maps {n:?}")),
            )
            .next();
        match merged {
            Some(what) => Err(format!(
                "{what}: merge plans are built from routing traces, and [run] \
                 trace_tokens_per_split = 0 collects none (set it above 0, or drop the merge method)"
            )),
            None => Ok(()),
        }
    }

    /// Refuses a noise floor decoded in micro-batches of the run's own
    /// size (`[run] n_ubatch`), which would perturb nothing, or larger
    /// ones, which a worker's context does not take.
    pub fn check_noise_ubatch(&self, n_ubatch: u32) -> Result<(), String> {
        match self.generate_noise_ubatch >= n_ubatch {
            true => Err(format!(
                "[eval] generate_noise_ubatch = {} is not smaller than [run] n_ubatch = \
                 {n_ubatch}: the noise floor needs a smaller micro-batch (1, the default, \
                 decodes prompts token by token; 0 turns it off)",
                self.generate_noise_ubatch
            )),
            false => Ok(()),
        }
    }

    /// The candidates' keep-map names, K resolved against `shape`:
    /// `keep_maps`, then each of `methods` at each size of `k`. Names that
    /// resolve to the same keep map (`50%` and `75%` of 2 experts) are
    /// evaluated once. Errors name the entry that cannot be run.
    pub fn candidate_names(&self, shape: &KeepShape) -> Result<Vec<String>, String> {
        self.validate()?;
        let mut names: Vec<String> = Vec::new();
        for name in &self.keep_maps {
            let resolved = match share_spec(name) {
                Some(parts) => {
                    let (method, spec) = parts?;
                    let k = shape
                        .resolve(spec)
                        .map_err(|e| format!("keep map {name:?}: {e}"))?;
                    KeepMapName::new(method, k).to_string()
                }
                None => name.clone(),
            };
            names.push(resolved);
        }
        for m in &self.methods {
            for spec in &self.k {
                let k = shape
                    .resolve(spec)
                    .map_err(|e| format!("[eval] k {spec:?}: {e}"))?;
                names.push(KeepMapName::new(&m.name(), k).to_string());
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        names.retain(|n| seen.insert(n.clone()));
        Ok(names)
    }

    /// The sizes the candidates need keep maps of (for `score`), sorted.
    pub fn sizes(&self, shape: &KeepShape) -> Result<Vec<u32>, String> {
        let mut ks: Vec<u32> = self
            .candidate_names(shape)?
            .iter()
            .filter_map(|n| Some(KeepMapName::parse(n)?.k))
            .collect();
        ks.sort_unstable();
        ks.dedup();
        Ok(ks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::method::Method;

    fn shape(n_expert: u32, n_expert_used: u32, groups: Option<(u32, u32)>) -> KeepShape {
        KeepShape {
            n_expert,
            n_expert_used,
            groups: groups.map(|(n_group, n_group_used)| ExpertGroups {
                n_group,
                n_group_used,
            }),
        }
    }

    fn err(r: Result<u32, String>) -> String {
        r.expect_err("refused")
    }

    #[test]
    fn shares_resolve_against_the_models_experts() {
        let tiny = shape(16, 4, None);
        assert_eq!(tiny.resolve("50%"), Ok(8));
        assert_eq!(tiny.resolve("75%"), Ok(12));
        assert_eq!(tiny.resolve(" 100% "), Ok(16));
        assert_eq!(tiny.resolve("12"), Ok(12));
        assert_eq!(shape(12, 2, None).resolve("75%"), Ok(9));
        assert_eq!(shape(24, 2, None).resolve("62.5%"), Ok(15));
        assert_eq!(shape(8, 2, None).resolve("50%"), Ok(4));
        // A share rounds down; a number is taken as written.
        assert_eq!(shape(7, 2, None).resolve("50%"), Ok(3));
    }

    #[test]
    fn sizes_that_cannot_run_are_refused_with_why() {
        let tiny = shape(16, 4, None);
        assert!(err(tiny.resolve("0%")).contains("(0, 100]"));
        assert!(err(tiny.resolve("150%")).contains("(0, 100]"));
        assert!(err(tiny.resolve("0")).contains("positive number"));
        assert!(err(tiny.resolve("half")).contains("share like \"50%\""));
        assert!(err(tiny.resolve("17")).contains("more than the model's 16"));
        let low = err(tiny.resolve("10%"));
        assert!(
            low.contains("10% of the model's 16 experts is 1") && low.contains("fewer than the 4"),
            "{low}"
        );
        assert!(err(tiny.resolve("3")).contains("fewer than the 4"));
    }

    #[test]
    fn grouped_routing_rounds_shares_to_whole_groups_and_refuses_uneven_numbers() {
        // 32 experts in 4 groups of 8, 2 groups per token, 4 experts used.
        let grouped = shape(32, 4, Some((4, 2)));
        assert_eq!(grouped.resolve("40%"), Ok(12));
        assert_eq!(grouped.resolve("50%"), Ok(16));
        assert_eq!(grouped.resolve("12"), Ok(12));
        assert!(err(grouped.resolve("10")).contains("multiple of the 4 routing groups"));
        // 20% is 6.4 -> 6 -> 4: one expert per group, which llama.cpp cannot rank.
        let thin = err(grouped.resolve("20%"));
        assert!(
            thin.contains("rounded down to a multiple of the 4 routing groups")
                && thin.contains("at least 2"),
            "{thin}"
        );
    }

    #[test]
    fn methods_times_sizes_follow_the_named_maps_in_order() {
        let s = EvalSettings {
            keep_maps: vec!["reap_mean_K4".into(), "frequency_K50%".into()],
            methods: vec![Method::Frequency.into(), Method::ReapHybrid.into()],
            k: vec!["50%".into(), "75%".into()],
            ..EvalSettings::default()
        };
        let tiny = shape(16, 4, None);
        assert!(s.needs_shape() && s.validate().is_ok());
        // frequency_K50% and frequency x 50% are one candidate.
        assert_eq!(
            s.candidate_names(&tiny).unwrap(),
            [
                "reap_mean_K4",
                "frequency_K8",
                "frequency_K12",
                "reap_hybrid_K8",
                "reap_hybrid_K12"
            ]
        );
        assert_eq!(s.sizes(&tiny).unwrap(), vec![4, 8, 12]);
        // On 2 experts, 50% and 75% are both 1.
        let pair = shape(2, 1, None);
        assert_eq!(
            s.candidate_names(&pair).unwrap(),
            ["reap_mean_K4", "frequency_K1", "reap_hybrid_K1"]
        );
    }

    #[test]
    fn a_merge_method_expands_to_its_merge_plans_beside_the_pruned_maps() {
        let s: EvalSettings = toml::from_str(
            "methods = [\"reap_hybrid\", \"reap_hybrid_merge\"]\nk = [\"50%\", \"24\"]",
        )
        .unwrap();
        assert_eq!(
            s.candidate_names(&shape(32, 4, None)).unwrap(),
            [
                "reap_hybrid_K16",
                "reap_hybrid_K24",
                "reap_hybrid_merge_K16",
                "reap_hybrid_merge_K24"
            ]
        );
        assert_eq!(s.sizes(&shape(32, 4, None)).unwrap(), vec![16, 24]);
        // Written back by name, as the run's manifest records the config.
        let back = toml::to_string(&s).unwrap();
        assert!(
            back.contains("methods = [\"reap_hybrid\", \"reap_hybrid_merge\"]"),
            "{back}"
        );
        let e = toml::from_str::<EvalSettings>("methods = [\"reap_merge\"]\nk = [\"8\"]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"reap_merge\" is not a scoring method"), "{e}");
    }

    #[test]
    fn merge_methods_need_routing_traces() {
        let s: EvalSettings =
            toml::from_str("methods = [\"frequency\", \"reap_hybrid_merge\"]\nk = [\"8\"]")
                .unwrap();
        assert!(s.check_merge_traces(65_536).is_ok());
        let e = s.check_merge_traces(0).unwrap_err();
        assert!(
            e.starts_with(
                "[eval] methods \"reap_hybrid_merge\": merge plans are built from routing traces"
            ),
            "{e}"
        );
        let named = EvalSettings {
            keep_maps: vec!["frequency_K8".into(), "reap_mean_merge_K8".into()],
            ..EvalSettings::default()
        };
        assert!(named
            .check_merge_traces(0)
            .unwrap_err()
            .starts_with("[eval] keep_maps \"reap_mean_merge_K8\""));
        let pruned = EvalSettings {
            keep_maps: vec!["frequency_K8".into()],
            ..EvalSettings::default()
        };
        assert!(pruned.check_merge_traces(0).is_ok());
    }

    #[test]
    fn the_budget_holds_for_every_domain_unless_pooled_is_asked_for() {
        assert_eq!(
            EvalSettings::default().budget_scope,
            BudgetScope::EveryDomain
        );
        let pooled: EvalSettings = toml::from_str("budget_scope = \"pooled\"").unwrap();
        assert_eq!(pooled.budget_scope, BudgetScope::Pooled);
        let err = toml::from_str::<EvalSettings>("budget_scope = \"worst\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("every_domain") && err.contains("pooled"),
            "{err}"
        );
    }

    #[test]
    fn positions_default_to_llama_perplexitys_second_half() {
        let s = EvalSettings::default();
        assert_eq!(s.skip_first_of(256), 128);
        assert_eq!(s.skip_first_of(512), 256);
        let all = EvalSettings {
            skip_first: Some(0),
            ..EvalSettings::default()
        };
        assert_eq!(all.skip_first_of(256), 0);
        let parsed: EvalSettings = toml::from_str("kl_budget = 0.05\nskip_first = 3").unwrap();
        assert_eq!((parsed.skip_first, parsed.kl_budget), (Some(3), Some(0.05)));
    }

    #[test]
    fn settings_are_checked_before_any_model_is_known() {
        let literal = EvalSettings {
            keep_maps: vec!["frequency_K8".into()],
            ..EvalSettings::default()
        };
        assert!(!literal.needs_shape() && literal.validate().is_ok());
        let half = EvalSettings {
            methods: vec![Method::Frequency.into()],
            ..EvalSettings::default()
        };
        assert!(half.is_configured());
        assert!(half.validate().unwrap_err().contains("go together"));
        let typo = toml::from_str::<EvalSettings>("methods = [\"frequncy\"]\nk = [\"50%\"]");
        let e = typo.unwrap_err().to_string();
        assert!(
            e.contains("\"frequncy\"") && e.contains("reap_hybrid"),
            "{e}"
        );
        let bad_k = EvalSettings {
            methods: vec![Method::Frequency.into()],
            k: vec!["50".into(), "5O%".into()],
            ..EvalSettings::default()
        };
        assert!(bad_k
            .validate()
            .unwrap_err()
            .starts_with("[eval] k \"5O%\""));
        let no_budget = EvalSettings {
            kl_budget: Some(-0.1),
            ..EvalSettings::default()
        };
        assert!(no_budget
            .validate()
            .unwrap_err()
            .starts_with("[eval] kl_budget: -0.1 is not a positive"));
        let bad_name = EvalSettings {
            keep_maps: vec!["frequency50%".into()],
            ..EvalSettings::default()
        };
        assert!(bad_name
            .validate()
            .unwrap_err()
            .contains("<method>_K<share>%"));
    }

    #[test]
    fn the_noise_floor_needs_another_micro_batch() {
        let s = EvalSettings::default();
        assert_eq!(s.generate_noise_ubatch, 1);
        assert!(s.check_noise_ubatch(512).is_ok());
        let e = s.check_noise_ubatch(1).unwrap_err();
        assert!(
            e.contains("generate_noise_ubatch = 1 is not smaller than [run] n_ubatch = 1"),
            "{e}"
        );
        let off = EvalSettings {
            generate_noise_ubatch: 0,
            ..EvalSettings::default()
        };
        assert!(off.check_noise_ubatch(512).is_ok());
    }
}
