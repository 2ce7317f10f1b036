//! The table of an evaluation: one row per pruned candidate (held-out and
//! fit KL, the paired difference against the best candidate, same top-1,
//! perplexities, per-domain held-out KL, the candidate's slot replacement
//! from `score`), each figure with its 95% interval by group clusters and
//! the number of clusters ("n/a" below two); after it the paired
//! comparisons where choices are made (two methods at one K, a K against
//! the next larger K of its method), when images were evaluated the KL of
//! each candidate per modality, llama-perplexity's KL block, the
//! generation check and what a KL budget picked.
//! `coordinator eval` prints it and the report shows it, with the
//! size-versus-KL table ([`size_table`]).

use crate::score::{self, tables::MapTable};
use crate::StagesError;
use numbers::eval::choice::{self, pareto_front};
use numbers::eval::summary::CandidateSummary;
use numbers::eval::{Comparison, EvalSummary, Figures, Interval, Paired};
use numbers::peer_text::table_cell;
use numbers::Split;
use runfiles::store::RunStore;
use std::fmt::Write;

/// `score`'s per-(method, K) tables from `score/score.json`, for the slot
/// replacement column: none when scoring has not run (the column reads `-`),
/// why not when the stored tables were scored from another saliency.
pub async fn slot_tables(store: &RunStore) -> Result<Result<Vec<MapTable>, String>, StagesError> {
    if !store.exists(runfiles::layout::score::REPORT_JSON).await? {
        return Ok(Ok(Vec::new()));
    }
    let sha = runfiles::saliency::read(store).await?.sha256;
    Ok(score::stored_report(store, &sha).await?.map(|r| r.tables))
}

fn kl(f: Option<&Figures>) -> String {
    f.map_or("-".into(), |f| {
        format!(
            "{} (p50 {:.4}, p90 {:.4}, p99 {:.4}, p99.9 {:.4}, max {:.4})",
            ci(f.kl.mean, &kl_ci(f), 4, 1.0),
            f.kl.p50,
            f.kl.p90,
            f.kl.p99,
            f.kl.p999,
            f.kl.max
        )
    })
}

/// The same-top-1 cell: a percentage with its interval, `-` without figures.
fn top1(f: Option<&Figures>) -> String {
    f.map_or("-".into(), |f| ci(f.top1_same, &f.top1_same_ci, 2, 100.0))
}

/// The perplexity cell: base / candidate / ratio with its interval.
fn perplexities(f: Option<&Figures>) -> String {
    f.map_or("-".into(), |f| {
        format!(
            "{:.3} / {:.3} / {}",
            f.ppl_base,
            f.ppl_candidate,
            ci(f.ppl_ratio, &f.ppl_ratio_ci, 4, 1.0)
        )
    })
}

/// `value [lo, hi] (G clusters)` with `digits` decimals, scaled by `scale`
/// (100 for %); `value [n/a] (G clusters)` when fewer than two clusters
/// leave the interval unknown.
fn ci(value: f64, iv: &Interval, digits: usize, scale: f64) -> String {
    interval(format!("{:.digits$}", scale * value), iv, |v| {
        format!("{:.digits$}", scale * v)
    })
}

/// [`ci`] of a difference: every figure signed.
fn signed(value: f64, iv: &Interval) -> String {
    interval(format!("{value:+.4}"), iv, |v| format!("{v:+.4}"))
}

/// `value [lo, hi] (G clusters)`, the ends written by `end`; `[n/a]` for
/// an unknown interval.
fn interval(value: String, iv: &Interval, end: impl Fn(f64) -> String) -> String {
    let clusters = match iv.clusters {
        1 => "1 cluster".to_string(),
        g => format!("{g} clusters"),
    };
    if iv.known() {
        format!("{value} [{}, {}] ({clusters})", end(iv.lo), end(iv.hi))
    } else {
        format!("{value} [n/a] ({clusters})")
    }
}

/// The paired difference of a candidate's KL against the best one's.
fn paired(p: Option<&Paired>, name: &str) -> String {
    match p {
        None => "-".into(),
        Some(p) if p.against == name => "best".into(),
        Some(p) => format!("{} vs {}", signed(p.diff, &p.ci), p.against),
    }
}

/// The paired comparisons of the basis split where choices are made: two
/// methods at the same K, a merged candidate against the pruned one of its
/// method and K, and each K against the next larger K of its method (the
/// cost of pruning further).
fn pairs_table(s: &EvalSummary) -> String {
    let basis = choice::basis(s);
    let rows: Vec<_> = s.pairs.iter().filter(|r| r.split == basis).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\nPaired comparisons ({basis} KL(a) - KL(b) per position, over the same positions; negative: a is closer to the base model; interval by group clusters of the difference; per domain over that domain's positions and clusters alone):\n\n| a | b | compares | KL(a) - KL(b) [95% interval] (clusters) | per domain |\n|---|---|---|---|---|\n"
    );
    for r in rows {
        let what = match r.compares {
            Comparison::SameK => "two methods at one K",
            Comparison::SmallerK => "a K against the next larger K",
            Comparison::MergedPruned => "merged against pruned (same method and K)",
        };
        let domains: Vec<String> = r
            .domains
            .iter()
            .map(|(name, d)| format!("{name} {}", signed(d.diff, &d.ci)))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {what} | {} | {} |",
            r.a,
            r.b,
            signed(r.diff, &r.ci),
            domains.join("; ")
        );
    }
    md
}

/// The Markdown table of an evaluation; `slots` are `score`'s tables (the
/// slot replacement column reads `-` for a candidate without one). Every
/// interval is a 95% interval by group clusters; after it, the paired
/// comparisons, the llama-perplexity KL block of each candidate and what a
/// KL budget picked.
pub fn table(s: &EvalSummary, slots: &[MapTable]) -> String {
    // Same top-1 and perplexity come from the held-out split, or from the
    // fit split in a run without one (and say so).
    let scored = |f: &&Figures| f.n > 0;
    let basis = choice::basis(s);
    let basis_label = match basis {
        Split::Heldout => "held-out",
        Split::Fit => "fit: no held-out split",
    };
    let mut md = format!(
        "| candidate | K | held-out KL mean [95% interval] (percentiles) | held-out KL against the best (paired) | fit KL mean [95% interval] (percentiles) | same top-1 ({basis_label}) | ppl base / candidate / ratio [95% interval] ({basis_label}) | held-out KL per domain | slot replacement |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in &s.candidates {
        let held = c.splits.get(&Split::Heldout).map(|x| &x.all).filter(scored);
        let fit = c.splits.get(&Split::Fit).map(|x| &x.all).filter(scored);
        let main = c.splits.get(&basis).map(|x| &x.all).filter(scored);
        let domains: Vec<String> = c
            .splits
            .get(&Split::Heldout)
            .map(|x| {
                x.domains
                    .iter()
                    .filter(|(d, _)| !s.eval_sets.contains(d))
                    .map(|(d, f)| format!("{} {}", table_cell(d), ci(f.kl.mean, &kl_ci(f), 4, 1.0)))
                    .collect()
            })
            .unwrap_or_default();
        let slot = slots
            .iter()
            .find(|t| t.method == c.method && t.k == c.k)
            .map_or("-".into(), |t| {
                format!("{:.1}%", 100.0 * t.slot_replacement_mean)
            });
        let pair = c
            .splits
            .get(&Split::Heldout)
            .filter(|x| x.all.n > 0)
            .and_then(|x| x.paired.as_ref());
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.name,
            c.k,
            kl(held),
            paired(pair, &c.name),
            kl(fit),
            top1(main),
            perplexities(main),
            if domains.is_empty() {
                "-".into()
            } else {
                domains.join(", ")
            },
            slot
        );
    }
    md.push_str(&pairs_table(s));
    md.push_str(&worst_domain_table(s));
    md.push_str(&eval_sets_table(s));
    md.push_str(&modality_table(s));
    md.push_str(&perplexity_block(s));
    md.push_str(&generation_table(s));
    md.push_str(&budget_lines(s));
    md
}

/// The interval of a figure's mean KL.
fn kl_ci(f: &Figures) -> Interval {
    Interval {
        se: f.kl.se,
        lo: f.kl.lo,
        hi: f.kl.hi,
        clusters: f.clusters,
    }
}

/// llama-perplexity's KL block per candidate over the basis split: mean
/// KL with llama-perplexity's error (positions independent) and the chunk
/// clusters', its percentiles down to 0.1% and the extremes, RMS Δp, same
/// top p and the perplexity ratio, each with its interval.
fn perplexity_block(s: &EvalSummary) -> String {
    let basis = choice::basis(s);
    let rows: Vec<_> = s
        .candidates
        .iter()
        .filter_map(|c| Some((c, choice::figures_in(c, basis)?)))
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = format!(
        "\nllama-perplexity's KL block ({basis}; percentiles interpolate as llama-perplexity's; ± is llama-perplexity's error with positions independent, [ ] the 95% interval by group clusters):\n\n| candidate | Mean KLD | Maximum | 99.9% | 99.0% | 95.0% | 90.0% | Median | 10.0% | 5.0% | 1.0% | 0.1% | Minimum | RMS Δp (%) | Same top p (%) | PPL(Q)/PPL(base) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for (c, f) in rows {
        let k = &f.kl;
        // The maximum, the percentiles from 99.9% down to 0.1%, the minimum.
        let tail = [
            k.max, k.p999, k.p99, k.p95, k.p90, k.p50, k.p10, k.p5, k.p1, k.p01, k.min,
        ];
        let tail: Vec<String> = tail.iter().map(|v| format!("{v:.6}")).collect();
        let _ = writeln!(
            md,
            "| {} | {:.6} ± {:.6} {} | {} | {} | {} | {} |",
            c.name,
            k.mean,
            k.se_positions,
            interval(String::new(), &kl_ci(f), |v| format!("{v:.6}")).trim_start(),
            tail.join(" | "),
            ci(f.dprob_rms, &f.dprob_rms_ci, 3, 100.0),
            ci(f.top1_same, &f.top1_same_ci, 3, 100.0),
            ci(f.ppl_ratio, &f.ppl_ratio_ci, 6, 1.0),
        );
    }
    md
}

/// One row per candidate: the calibration domain it serves worst (the
/// highest mean KL on the held-out split, else the fit split) and that KL,
/// so `worst_domain` maps compare with the others on what they maximise.
fn worst_domain_table(s: &EvalSummary) -> String {
    fn worst(c: &CandidateSummary) -> Option<(Split, &String, &Figures)> {
        [Split::Heldout, Split::Fit].into_iter().find_map(|split| {
            let f = c.splits.get(&split)?;
            let name = f.worst_domain.as_ref()?;
            Some((split, name, f.domains.get(name)?))
        })
    }
    let rows: Vec<String> = s
        .candidates
        .iter()
        .filter_map(|c| {
            let (split, name, f) = worst(c)?;
            Some(format!(
                "| {} | {} | {} ({}) | {} |\n",
                c.name,
                c.k,
                table_cell(name),
                split.as_str(),
                ci(f.kl.mean, &kl_ci(f), 4, 1.0)
            ))
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "\nThe worst-served domain of each candidate (highest mean KL):\n\n| candidate | K | worst domain (split) | its KL mean [95% interval] |\n|---|---|---|---|\n{}",
        rows.concat()
    )
}

/// One row per candidate and eval set (`[[corpus.eval_sets]]`, held out
/// whole, never calibrated on): the figures on the user's own test text.
fn eval_sets_table(s: &EvalSummary) -> String {
    if s.eval_sets.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\nEval sets (held out whole, never calibrated on):\n\n| candidate | eval set | positions | KL mean [95% interval] (percentiles) | same top-1 | ppl base / candidate / ratio [95% interval] |\n|---|---|---|---|---|---|\n",
    );
    for c in &s.candidates {
        for name in &s.eval_sets {
            let f = c
                .splits
                .get(&Split::Heldout)
                .and_then(|x| x.domains.get(name))
                .filter(|f| f.n > 0);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                c.name,
                table_cell(name),
                f.map_or(0, |f| f.n),
                kl(f),
                top1(f),
                perplexities(f),
            );
        }
    }
    md
}

/// The generation check, when the evaluation generated: per candidate (and
/// first the base model against itself, the noise floor) the matched
/// prefix with its interval by prompt, the identical share and the
/// agreement up to the first difference, overall and per domain; then the
/// domains without prompts and why.
fn generation_table(s: &EvalSummary) -> String {
    let mut rows: Vec<(String, &numbers::eval::GenerationSummary)> = Vec::new();
    if let Some(noise) = &s.generation_noise {
        rows.push((
            format!("base vs base (n_ubatch {})", noise.n_ubatch),
            &noise.figures,
        ));
    }
    rows.extend(
        s.candidates
            .iter()
            .filter_map(|c| Some((c.name.clone(), c.generation.as_ref()?))),
    );
    let Some((_, first)) = rows.first() else {
        return match s.generation_unprompted.is_empty() {
            true => String::new(),
            false => format!("\nGeneration check: no prompts.\n{}", unprompted(s)),
        };
    };
    let shortest = rows.iter().map(|(_, g)| g.prompt_tokens.0).min();
    let longest = rows.iter().map(|(_, g)| g.prompt_tokens.1).max();
    let (shortest, longest) = (shortest.unwrap_or(0), longest.unwrap_or(0));
    let lengths = match shortest == longest {
        true => format!("{shortest}"),
        false => format!("{shortest} to {longest}"),
    };
    let mut md = format!(
        "\nGeneration check (greedy continuations of held-out prompts of {lengths} tokens, each a document's first tokens or a conversation up to an assistant turn, {new} new tokens each, against the base model's; matched prefix: tokens before the first difference, mean with its 95% interval by prompt; agreement: tokens that agree up to and at the first difference; `base vs base` is the noise floor, the base model with its prompts decoded in another micro-batch size):\n\n| model | prompts | matched prefix (of {new}) | identical | agreement | matched prefix per domain |\n|---|---|---|---|---|---|\n",
        new = first.new_tokens
    );
    for (name, g) in &rows {
        let domains: Vec<String> = g
            .domains
            .iter()
            .map(|(d, f)| format!("{} {:.1} ({})", table_cell(d), f.matched_prefix, f.prompts))
            .collect();
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} ({:.0}%) | {:.1}% | {} |",
            g.all.prompts,
            by_prompt(g.all.matched_prefix, &g.all.matched_prefix_ci),
            g.all.identical,
            100.0 * g.all.identical_share,
            100.0 * g.all.agreement,
            domains.join(", ")
        );
    }
    md.push_str(&unprompted(s));
    md
}

/// A matched prefix with its interval by prompt, `[n/a]` below two prompts.
fn by_prompt(value: f64, iv: &Interval) -> String {
    match iv.known() {
        true => format!("{value:.1} [{:.1}, {:.1}]", iv.lo, iv.hi),
        false => format!("{value:.1} [n/a]"),
    }
}

/// The domains without generation prompts, one line each with why.
fn unprompted(s: &EvalSummary) -> String {
    let mut md = String::new();
    for (d, why) in &s.generation_unprompted {
        let _ = writeln!(
            md,
            "- no prompts for {}: {}",
            table_cell(d),
            table_cell(why)
        );
    }
    if !md.is_empty() {
        md.insert(0, '\n');
    }
    md
}

/// What the KL budget picked per method, when one was given, and the
/// figure that binds each pick.
fn budget_lines(s: &EvalSummary) -> String {
    let Some(b) = &s.budget else {
        return String::new();
    };
    let scope = match b.scope {
        numbers::eval::BudgetScope::EveryDomain => "every domain's and eval set's",
        numbers::eval::BudgetScope::Pooled => "the pooled",
    };
    let mut md = format!(
        "\nK within a KL budget of {} ({scope} {} KL, upper end of the 95% interval; the K picked and every larger K fit):\n\n",
        b.kl_budget, b.split
    );
    if let Some(why) = &b.message {
        let _ = writeln!(md, "- {why}");
    }
    for (method, pick) in &b.picks {
        let bind = b.binding.get(method).and_then(Option::as_ref).map(|x| {
            let upper = if x.hi.is_nan() {
                "n/a".to_string()
            } else {
                format!("{:.4}", x.hi)
            };
            let missed = x
                .missed
                .as_ref()
                .map_or(String::new(), |m| format!("; {m} misses"));
            format!(
                " (binding: {} at {}, upper end {upper} over {} clusters{missed})",
                table_cell(&x.domain),
                x.candidate,
                x.clusters
            )
        });
        let bind = bind.unwrap_or_default();
        let _ = match pick {
            Some(name) => writeln!(md, "- {method}: {name}{bind}"),
            None => writeln!(md, "- {method}: no evaluated K fits{bind}"),
        };
    }
    if !b.unchecked.is_empty() {
        let names: Vec<String> = b.unchecked.iter().map(|d| table_cell(d)).collect();
        let _ = writeln!(
            md,
            "- not checked, no held-out positions: {}",
            names.join(", ")
        );
    }
    md
}

/// A point of the size-versus-KL table: a model file and its KL.
pub struct SizePoint<'a> {
    /// Candidate or file name.
    pub name: &'a str,
    /// Where its figures come from (`eval`, or `ship` for shipped files).
    pub source: &'a str,
    /// File size in bytes.
    pub bytes: u64,
    /// Its whole-split figures.
    pub figures: &'a Figures,
}

/// The size points of an evaluation's candidates with a known size, from
/// the `split` figures.
pub fn size_points<'a>(s: &'a EvalSummary, source: &'a str, split: Split) -> Vec<SizePoint<'a>> {
    s.candidates
        .iter()
        .filter_map(|c| {
            Some(SizePoint {
                name: &c.name,
                source,
                bytes: c.bytes?,
                figures: choice::figures_in(c, split)?,
            })
        })
        .collect()
}

/// The size-versus-KL table of `points`, smallest first, with the Pareto
/// front marked (no other file is both smaller and closer to the base
/// model, by mean KL); empty without points.
pub fn size_table(points: &[SizePoint<'_>], split: Split) -> String {
    if points.is_empty() {
        return String::new();
    }
    let front = pareto_front(
        &points
            .iter()
            .map(|p| (p.bytes, p.figures.kl.mean))
            .collect::<Vec<_>>(),
    );
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by_key(|&i| (points[i].bytes, points[i].name));
    let mut md = format!(
        "| file | from | bytes | {split} KL mean [95% interval] | Pareto front |\n|---|---|---|---|---|\n"
    );
    for i in order {
        let p = &points[i];
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            p.name,
            p.source,
            p.bytes,
            ci(p.figures.kl.mean, &kl_ci(p.figures), 6, 1.0),
            if front[i] { "yes" } else { "" }
        );
    }
    md
}

/// Per candidate and split, the KL on text positions and on
/// image-conditioned ones (positions whose context holds an image); empty
/// when the evaluation scored no image-conditioned position.
fn modality_table(s: &EvalSummary) -> String {
    let rows: Vec<_> = s
        .candidates
        .iter()
        .flat_map(|c| c.splits.iter().map(move |(split, f)| (c, split, f)))
        .filter(|(_, _, f)| !f.modalities.is_empty() && f.all.n > 0)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut md = String::from(
        "\nKL per modality (image: positions whose context holds an image, the text after it included):\n\n| candidate | K | split | text KL mean [95% interval] (percentiles) | text positions | image KL mean [95% interval] (percentiles) | image positions |\n|---|---|---|---|---|---|---|\n",
    );
    for (c, split, f) in rows {
        let (text, image) = (f.modalities.get("text"), f.modalities.get("image"));
        let n = |f: Option<&Figures>| f.map_or(0, |f| f.n);
        let _ = writeln!(
            md,
            "| {} | {} | {split} | {} | {} | {} | {} |",
            c.name,
            c.k,
            kl(text.filter(|f| f.n > 0)),
            n(text),
            kl(image.filter(|f| f.n > 0)),
            n(image)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::eval::summary::{CandidateSummary, SplitFigures};
    use std::collections::BTreeMap;

    fn summary(splits: &[(&str, f64)]) -> EvalSummary {
        let figures = |top1| SplitFigures {
            all: Figures {
                n: 10,
                top1_same: top1,
                ..Figures::default()
            },
            domains: BTreeMap::new(),
            modalities: BTreeMap::new(),
            paired: None,
            worst_domain: None,
        };
        EvalSummary {
            base_sha256: String::new(),
            corpus_sha256: String::new(),
            skip_first: 0,
            n_chunks: 1,
            backends: Vec::new(),
            uncertainty: String::new(),
            budget: None,
            eval_sets: Vec::new(),
            domains: Vec::new(),
            pairs: Vec::new(),
            generation_noise: None,
            generation_unprompted: BTreeMap::new(),
            candidates: vec![CandidateSummary {
                name: "frequency_K2".into(),
                method: "frequency".into(),
                k: 2,
                sha256: String::new(),
                splits: splits
                    .iter()
                    .map(|&(s, top1)| (Split::parse(s).unwrap(), figures(top1)))
                    .collect(),
                bytes: None,
                generation: None,
            }],
        }
    }

    #[test]
    fn the_generation_check_has_its_own_table() {
        let mut s = summary(&[("heldout", 0.5)]);
        assert!(!table(&s, &[]).contains("Generation check"));
        let gen = numbers::eval::Generation::of;
        let gens = [
            // Differs at 2 (4 agrees again, after the difference: not
            // counted): 2 of 3 compared.
            (4, gen(0, 64, &[1, 2, 3, 4], &[1, 2, 9, 4])),
            (8, gen(1, 40, &[1, 2, 3, 4], &[1, 2, 3, 4])),
        ]
        .into();
        let names = ["english".to_string(), "code".to_string()];
        s.candidates[0].generation = numbers::eval::GenerationSummary::of(&gens, 4, &names);
        let noise = [(4, gen(0, 64, &[1, 2, 3, 4], &[1, 2, 3, 4]))].into();
        s.generation_noise = Some(numbers::eval::GenerationNoise {
            n_ubatch: 1,
            figures: numbers::eval::GenerationSummary::of(&noise, 4, &names).unwrap(),
        });
        s.generation_unprompted = [("chat".to_string(), "no held-out text".to_string())].into();
        let md = table(&s, &[]);
        assert!(
            md.contains("prompts of 40 to 64 tokens, each a document's first tokens or a conversation up to an assistant turn, 4 new tokens each"),
            "{md}"
        );
        // Matched prefixes 2 and 4: mean 3, se 1, t(0.975, 1) = 12.7062.
        assert!(
            md.contains("| frequency_K2 | 2 | 3.0 [-9.7, 15.7] | 1 (50%) | 85.7% | code 4.0 (1), english 2.0 (1) |"),
            "{md}"
        );
        // The noise row comes first; one prompt has no interval.
        assert!(
            md.contains("|---|\n| base vs base (n_ubatch 1) | 1 | 4.0 [n/a] | 1 (100%) | 100.0% | english 4.0 (1) |"),
            "{md}"
        );
        assert!(
            md.contains("- no prompts for chat: no held-out text"),
            "{md}"
        );
    }

    #[test]
    fn each_eval_set_is_a_row_of_its_own() {
        let mut s = summary(&[("heldout", 0.5)]);
        assert!(!table(&s, &[]).contains("Eval sets"));
        let wiki = Figures {
            n: 7,
            top1_same: 0.75,
            ..Figures::default()
        };
        let held = s.candidates[0].splits.get_mut(&Split::Heldout).unwrap();
        held.domains.insert("wiki_test".into(), wiki);
        s.eval_sets = vec!["wiki_test".into(), "empty_set".into()];
        let md = table(&s, &[]);
        assert!(md.contains("Eval sets (held out whole"), "{md}");
        assert!(
            md.contains("| frequency_K2 | wiki_test | 7 | 0.0000 [n/a] (0 clusters)"),
            "{md}"
        );
        assert!(md.contains("| 75.00 [n/a] (0 clusters) |"), "{md}");
        assert!(
            md.contains("| frequency_K2 | empty_set | 0 | - | - | - |"),
            "{md}"
        );
    }

    #[test]
    fn same_top1_and_perplexity_name_the_split_they_come_from() {
        let both = table(&summary(&[("fit", 0.25), ("heldout", 0.5)]), &[]);
        assert!(both.contains("same top-1 (held-out)"), "{both}");
        assert!(
            both.contains("| 50.00 [n/a] (0 clusters) |"),
            "held-out figure: {both}"
        );
        let fit_only = table(&summary(&[("fit", 0.25)]), &[]);
        assert!(!fit_only.contains("(held-out)"), "{fit_only}");
        assert!(
            fit_only.contains("same top-1 (fit: no held-out split)"),
            "{fit_only}"
        );
        assert!(
            fit_only.contains("| 25.00 [n/a] (0 clusters) |"),
            "fit figure: {fit_only}"
        );
        // A held-out split without scored positions is no basis either.
        let mut empty = summary(&[("fit", 0.25), ("heldout", 0.5)]);
        empty.candidates[0]
            .splits
            .get_mut(&Split::Heldout)
            .unwrap()
            .all
            .n = 0;
        let md = table(&empty, &[]);
        assert!(md.contains("same top-1 (fit: no held-out split)"), "{md}");
        assert!(md.contains("| 25.00 [n/a] (0 clusters) |"), "{md}");
    }

    #[test]
    fn a_text_evaluation_has_no_modality_table_and_an_image_one_has_it() {
        let mut s = summary(&[("fit", 0.25)]);
        assert!(!table(&s, &[]).contains("KL per modality"));
        let f = |n, mean| Figures {
            n,
            kl: numbers::eval::KlFigures {
                mean,
                ..Default::default()
            },
            ..Figures::default()
        };
        let fit = s.candidates[0].splits.get_mut(&Split::Fit).unwrap();
        fit.modalities =
            BTreeMap::from([("text".into(), f(6, 0.125)), ("image".into(), f(4, 0.5))]);
        let md = table(&s, &[]);
        assert!(md.contains("KL per modality"), "{md}");
        assert!(
            md.contains("| frequency_K2 | 2 | fit | 0.1250 [n/a] (0 clusters) (p50 0.0000, p90 0.0000, p99 0.0000, p99.9 0.0000, max 0.0000) | 6 | 0.5000 [n/a] (0 clusters)"),
            "{md}"
        );
        assert!(md.contains("| 4 |"), "{md}");
    }

    #[test]
    fn intervals_name_their_clusters_pairs_and_the_binding_domain_are_listed() {
        use numbers::eval::{Binding, BudgetPicks, BudgetScope, DomainDiff, KlFigures, PairedRow};
        let mut s = summary(&[("heldout", 0.5)]);
        let kl = |lo, hi| KlFigures {
            mean: 0.25,
            lo,
            hi,
            ..KlFigures::default()
        };
        let held = &mut s.candidates[0].splits.get_mut(&Split::Heldout).unwrap().all;
        (held.clusters, held.kl) = (1, kl(f64::NAN, f64::NAN));
        let md = table(&s, &[]);
        // One cluster: no interval, never [m, m].
        assert!(md.contains("| 0.2500 [n/a] (1 cluster) (p50"), "{md}");
        let held = &mut s.candidates[0].splits.get_mut(&Split::Heldout).unwrap().all;
        (held.clusters, held.kl) = (3, kl(0.1, 0.4));
        s.pairs = vec![PairedRow {
            split: Split::Heldout,
            compares: Comparison::SameK,
            a: "reap_hybrid_K2".into(),
            b: "frequency_K2".into(),
            diff: -0.05,
            ci: Interval {
                se: 0.01,
                lo: -0.08,
                hi: -0.02,
                clusters: 3,
            },
            domains: BTreeMap::from([(
                "code".into(),
                DomainDiff {
                    diff: -0.2,
                    ci: Interval {
                        se: 0.05,
                        lo: -0.3,
                        hi: -0.1,
                        clusters: 2,
                    },
                },
            )]),
        }];
        s.pairs.push(PairedRow {
            compares: Comparison::MergedPruned,
            a: "reap_hybrid_merge_K2".into(),
            b: "reap_hybrid_K2".into(),
            diff: 0.125,
            ci: Interval {
                se: 0.01,
                lo: 0.1,
                hi: 0.15,
                clusters: 3,
            },
            ..s.pairs[0].clone()
        });
        s.budget = Some(BudgetPicks {
            kl_budget: 0.5,
            split: Split::Heldout,
            scope: BudgetScope::EveryDomain,
            picks: BTreeMap::from([("frequency".into(), Some("frequency_K2".into()))]),
            binding: BTreeMap::from([(
                "frequency".into(),
                Some(Binding {
                    candidate: "frequency_K2".into(),
                    domain: "japanese".into(),
                    hi: 0.4,
                    clusters: 3,
                    missed: None,
                }),
            )]),
            unchecked: vec!["chat".into()],
            message: None,
        });
        let md = table(&s, &[]);
        assert!(
            md.contains("| 0.2500 [0.1000, 0.4000] (3 clusters) (p50"),
            "{md}"
        );
        assert!(
            md.contains("| reap_hybrid_K2 | frequency_K2 | two methods at one K | -0.0500 [-0.0800, -0.0200] (3 clusters) | code -0.2000 [-0.3000, -0.1000] (2 clusters) |"),
            "{md}"
        );
        assert!(
            md.contains("| reap_hybrid_merge_K2 | reap_hybrid_K2 | merged against pruned (same method and K) | +0.1250 [+0.1000, +0.1500] (3 clusters) |"),
            "{md}"
        );
        assert!(
            md.contains("- frequency: frequency_K2 (binding: japanese at frequency_K2, upper end 0.4000 over 3 clusters)"),
            "{md}"
        );
        assert!(
            md.contains("- not checked, no held-out positions: chat"),
            "{md}"
        );
    }
}
