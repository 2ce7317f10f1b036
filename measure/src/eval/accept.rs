//! Acceptance of an eval partial before it is merged: its chunks, the run's
//! base model and corpus, the job's settings, every candidate's SHA-256
//! against the coordinator's own slice, the sums' own consistency, every
//! figure within what the lease can produce ([`numbers::eval::bounds`]:
//! finite KL of at least 0, counts in range, sums those of their positions;
//! backend names short and printable) and every per-position figure one of
//! the lease's scored positions, in its group, each scored
//! ([`super::scoreable`]). The same checks serve results from workers and
//! eval partials read back on resume (where a partial that fails them is
//! set aside and recomputed).

use super::scoreable::Scoreable;
use numbers::eval::EvalPartial;
use numbers::peer_text::peer_text;
use numbers::ChunkRange;
use protocol::wire::{EvalJob, Task};
use runfiles::layout::LeaseLayout;
use runfiles::manifest::{Records, RunManifest};
use runtime::lease::LeaseKind;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What an eval partial of this run must match.
#[derive(Clone, Debug)]
pub struct EvalAcceptance {
    /// Where its eval partials are stored.
    pub partials: LeaseLayout,
    /// SHA-256 of the base model.
    pub base_sha256: String,
    /// SHA-256 of the corpus chunk table.
    pub corpus_sha256: String,
    /// The evaluation job.
    pub job: EvalJob,
    /// The corpus's scored positions per chunk.
    pub corpus: Arc<Scoreable>,
    /// Tokens of the corpus (the budget of every sum).
    pub corpus_tokens: u64,
}

/// Evaluation leases: workers evaluate the job's candidates, and each eval
/// partial passes [`check_against_job`].
impl LeaseKind for EvalAcceptance {
    type Output = EvalPartial;

    fn task(&self) -> Task {
        Task::Evaluate(self.job.clone())
    }

    fn table(m: &mut RunManifest) -> &mut Records {
        &mut m.eval_partials
    }

    fn decode_and_check(
        &self,
        units: &[ChunkRange],
        bytes: bytes::Bytes,
    ) -> Result<EvalPartial, String> {
        let p = <EvalPartial as runfiles::lease::LeaseOutput>::decode(&bytes)?;
        check_against_job(&p, units, &self.base_sha256, &self.corpus_sha256, &self.job)?;
        check_against_corpus(&p, units, &self.corpus, self.corpus_tokens, &self.job)?;
        Ok(p)
    }

    fn layout(&self) -> LeaseLayout {
        self.partials
    }
}

/// Whether `gens` (a candidate's, or the noise floor's) are exactly the
/// job's prompts whose documents start in `units`, each of its prompt's
/// domain and length. Whether each figure is possible is
/// [`numbers::eval::bounds`]'s check.
fn check_generations(
    gens: &BTreeMap<u32, numbers::eval::Generation>,
    units: &[ChunkRange],
    job: &numbers::eval::GenerateJob,
) -> Result<(), String> {
    let want = job.prompts_of(|chunk| units.iter().any(|r| r.contains(chunk)));
    if gens.len() != want.len() {
        return Err(format!(
            "{} generations for the lease's {} prompts",
            gens.len(),
            want.len()
        ));
    }
    for ((id, prompt), (got_id, g)) in want.into_iter().zip(gens) {
        let (domain, tokens) = (prompt.domain, prompt.tokens.len() as u64);
        if (id, domain, tokens) != (*got_id, g.domain, u64::from(g.prompt_tokens)) {
            return Err(format!(
                "a generation of prompt {got_id} in domain {} after {} tokens, the job's prompt is {id} in domain {domain} of {tokens} tokens",
                g.domain, g.prompt_tokens
            ));
        }
    }
    Ok(())
}

/// Whether an eval partial is the lease's: its chunks, the run's base model
/// and corpus, the job's settings, every candidate with the name and the
/// SHA-256 of the coordinator's slice, and sums that agree with themselves
/// (each candidate scored the base model's positions, one KL value each).
/// Serves results from workers and eval partials read back on resume.
pub fn check_against_job(
    p: &EvalPartial,
    units: &[ChunkRange],
    base_sha256: &str,
    corpus_sha256: &str,
    job: &EvalJob,
) -> Result<(), String> {
    runtime::lease::check_covers("eval partial", units, &p.chunks)?;
    if p.base_sha256 != base_sha256 {
        return Err(format!(
            "eval partial of base model \"{}\", the run's is {base_sha256}",
            peer_text(&p.base_sha256)
        ));
    }
    if p.corpus_sha256 != corpus_sha256 {
        return Err(format!(
            "eval partial of corpus \"{}\", the run's is {corpus_sha256}",
            peer_text(&p.corpus_sha256)
        ));
    }
    if (p.skip_first, &p.splits) != (job.skip_first, &job.splits) {
        return Err(format!(
            "eval partial scored (skip_first {}, splits [{}]), the job asked for ({}, [{}])",
            p.skip_first,
            numbers::peer_text::summarise(&p.splits),
            job.skip_first,
            numbers::peer_text::summarise(&job.splits)
        ));
    }
    if p.generate != job.generate.settings() {
        return Err(format!(
            "eval partial generated (new tokens, noise micro-batch) {:?}, the job asked for {:?}",
            p.generate,
            job.generate.settings()
        ));
    }
    match job.generate.noise_ubatch {
        0 if !p.noise.is_empty() => {
            return Err("eval partial has a noise floor the job did not ask for".into())
        }
        0 => {}
        _ => check_generations(&p.noise, units, &job.generate)
            .map_err(|e| format!("noise floor: {e}"))?,
    }
    if p.candidates.len() != job.candidates.len() {
        return Err(format!(
            "eval partial has {} candidates, the job {}",
            p.candidates.len(),
            job.candidates.len()
        ));
    }
    for (got, want) in p.candidates.iter().zip(&job.candidates) {
        if got.name != want.name {
            return Err(format!(
                "eval partial has candidate \"{}\" where the job has {:?}",
                peer_text(&got.name),
                want.name
            ));
        }
        if got.sha256 != want.sha256 {
            return Err(format!(
                "candidate {}: the worker's slice has SHA-256 \"{}\", the coordinator's {}",
                want.name,
                peer_text(&got.sha256),
                want.sha256
            ));
        }
        for (g, base) in &p.base {
            let n = got.groups.get(g).map_or(0, |s| s.n);
            if n != base.n {
                return Err(format!(
                    "candidate {}: {n} positions scored in {g:?}, the base model {}",
                    want.name, base.n
                ));
            }
        }
        if got.groups.keys().any(|g| !p.base.contains_key(g)) {
            return Err(format!(
                "candidate {}: a group the base model did not score",
                want.name
            ));
        }
        got.check_chunk_sums(&p.base, &p.chunks)
            .map_err(|e| format!("candidate {}: {e}", want.name))?;
        check_generations(&got.generations, units, &job.generate)
            .map_err(|e| format!("candidate {}: {e}", want.name))?;
        if got.tokens.len() as u64 != p.n_scored() {
            return Err(format!(
                "candidate {}: {} per-position KL values for {} scored positions",
                want.name,
                got.tokens.len(),
                p.n_scored()
            ));
        }
    }
    Ok(())
}

/// Whether every figure of an eval partial is one the lease's chunks can
/// produce: bounded ([`numbers::eval::bounds::check_figures`]), every
/// per-position figure of a position of the lease's chunks that `corpus`
/// scores, in its group, and every scored position of the lease there
/// (no group without positions).
pub fn check_against_corpus(
    p: &EvalPartial,
    units: &[ChunkRange],
    corpus: &Scoreable,
    corpus_tokens: u64,
    job: &EvalJob,
) -> Result<(), String> {
    numbers::eval::bounds::check_figures(p, corpus_tokens)?;
    if let Some((g, _)) = p.base.iter().find(|(_, b)| b.n == 0) {
        return Err(format!(
            "eval partial lists group {g:?} with no scored position"
        ));
    }
    let in_lease = |chunk: u32| units.iter().any(|r| r.contains(chunk));
    let want: u64 = units
        .iter()
        .flat_map(|r| r.start..r.end)
        .map(|c| corpus.n_scored(c, job.skip_first, &job.splits))
        .sum();
    for c in &p.candidates {
        let name = peer_text(&c.name);
        for t in &c.tokens {
            if !in_lease(t.chunk) {
                return Err(format!(
                    "candidate {name}: a per-position figure of chunk {}, outside the lease ({})",
                    t.chunk,
                    numbers::peer_text::summarise(units)
                ));
            }
            corpus
                .check_position(t, job.skip_first, &job.splits)
                .map_err(|e| format!("candidate {name}: {e}"))?;
        }
        if c.tokens.len() as u64 != want {
            return Err(format!(
                "candidate {name}: {} positions scored, the lease's chunks have {want}",
                c.tokens.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use numbers::eval::{BaseSums, CandidateResult, CandidateSums, Group, TokenKl};
    use numbers::Split;
    use protocol::wire::EvalCandidate;

    const RANGE: ChunkRange = ChunkRange { start: 2, end: 4 };

    fn job() -> EvalJob {
        EvalJob {
            candidates: vec![EvalCandidate {
                name: "frequency_K8".into(),
                keep_map: Some("keep_maps/frequency_K8.json".into()),
                sha256: "c".repeat(64),
                expert_used: None,
                quant: None,
            }],
            skip_first: 0,
            splits: vec![Split::Fit],
            models_in_memory: Default::default(),
            scratch_dir: None,
            generate: numbers::eval::GenerateJob {
                prompts: vec![prompt(3, 0, 8), prompt(7, 1, 6), prompt(2, 1, 5)],
                new_tokens: 4,
                noise_ubatch: 1,
                unprompted: BTreeMap::new(),
            },
        }
    }

    /// A prompt of `len` tokens of a document of `domain` starting in `chunk`.
    fn prompt(chunk: u32, domain: u16, len: usize) -> numbers::eval::Prompt {
        numbers::eval::Prompt {
            chunk,
            domain,
            doc: chunk,
            after_user_turn: false,
            tokens: vec![1; len],
        }
    }

    /// A partial of one candidate over two scored positions of one group
    /// (chunk 2, positions 0 and 1, KL 0.5 each).
    fn partial() -> EvalPartial {
        let group = Group::text(Split::Fit, 0);
        let token = |pos| TokenKl {
            chunk: 2,
            pos,
            cluster: 0,
            group,
            kl: 0.5,
        };
        of_tokens(vec![token(0), token(1)])
    }

    /// A partial of one candidate whose every sum is that of `tokens` (as a
    /// careful forger makes them; a value no exact sum holds is left out).
    fn of_tokens(tokens: Vec<TokenKl>) -> EvalPartial {
        let mut base: BTreeMap<Group, BaseSums> = BTreeMap::new();
        let mut groups: BTreeMap<Group, CandidateSums> = BTreeMap::new();
        let mut chunks: BTreeMap<numbers::eval::CellKey, numbers::eval::ChunkSums> =
            BTreeMap::new();
        for t in &tokens {
            base.entry(t.group).or_default().n += 1;
            let g = groups.entry(t.group).or_default();
            g.n += 1;
            let _ = g.kl.add_f64(t.kl);
            let _ = g.kl_sq.add_f64(t.kl * t.kl);
            let c = chunks.entry((t.chunk, t.cluster, t.group)).or_default();
            c.n += 1;
            let _ = c.kl.add_f64(t.kl);
        }
        EvalPartial {
            format_version: numbers::eval::EVAL_FORMAT_VERSION,
            base_sha256: "b".repeat(64),
            corpus_sha256: "k".into(),
            skip_first: 0,
            splits: vec![Split::Fit],
            generate: (4, 1),
            backends: vec!["cpu".into()],
            chunks: vec![RANGE],
            base,
            candidates: vec![CandidateResult {
                name: "frequency_K8".into(),
                sha256: "c".repeat(64),
                k: 8,
                groups,
                chunks,
                tokens,
                generations: generations(),
            }],
            noise: generations(),
        }
    }

    /// Continuations of the lease's prompts: 0 (chunk 3) and 2 (chunk 2).
    fn generations() -> BTreeMap<u32, numbers::eval::Generation> {
        let gen = numbers::eval::Generation::of;
        [
            (0, gen(0, 8, &[1, 2, 3, 4], &[1, 2, 5, 6])),
            (2, gen(1, 5, &[1, 2, 3, 4], &[1, 2, 3, 4])),
        ]
        .into()
    }

    /// Damages a partial in one way.
    type Change = fn(&mut EvalPartial);

    fn check(p: &EvalPartial) -> Result<(), String> {
        check_against_job(p, &[RANGE], &"b".repeat(64), "k", &job())
    }

    /// A corpus of 5 chunks, one fit span of domain 0 each: chunk 2 has 3
    /// tokens (positions 0 and 1 scored), the others one (none scored).
    fn corpus() -> Scoreable {
        Scoreable::one_span_each(&[1, 1, 3, 1, 1], &["en".into(), "code".into()])
    }

    /// Every check of acceptance.
    fn check_all(p: &EvalPartial) -> Result<(), String> {
        check(p)?;
        check_against_corpus(p, &[RANGE], &corpus(), 100, &job())
    }

    #[test]
    fn a_partial_of_the_job_passes() {
        check_all(&partial()).unwrap();
        let mut p = partial();
        p.candidates[0]
            .generations
            .values_mut()
            .for_each(|g| g.matched = 9);
        let e = check_all(&p).unwrap_err();
        assert!(e.contains("impossible for 4 new tokens"), "{e}");
    }

    #[test]
    fn figures_the_lease_cannot_produce_are_refused_by_name() {
        let token = |chunk, pos, domain, kl| TokenKl {
            chunk,
            pos,
            cluster: 0,
            group: Group::text(Split::Fit, domain),
            kl,
        };
        // The chunk's two scored positions and one more.
        let and = |extra| vec![token(2, 0, 0, 0.5), token(2, 1, 0, 0.5), extra];
        let cases = [
            (
                vec![token(2, 0, 0, f64::NAN), token(2, 1, 0, 0.5)],
                "per-position KL is NaN at chunk 2 position 0",
            ),
            (
                vec![token(2, 0, 0, f64::INFINITY), token(2, 1, 0, 0.5)],
                "per-position KL is infinite",
            ),
            (
                vec![token(2, 0, 0, -0.25), token(2, 1, 0, 0.5)],
                "per-position KL is negative (-0.25)",
            ),
            (
                vec![token(2, 0, 0, 0.5), token(2, 40, 0, 0.5)],
                "position 40 of chunk 2 is not scored: it is past the chunk's last token",
            ),
            (
                and(token(2, 2, 0, 0.5)),
                "position 2 of chunk 2 is not scored: it is the last of its span",
            ),
            (
                vec![token(2, 0, 1, 0.5), token(2, 1, 1, 0.5)],
                "scored in fit domain 1 (code), the chunk holds fit domain 0 (en)",
            ),
            (
                vec![token(2, 0, 0, 0.0)],
                "1 positions scored, the lease's chunks have 2",
            ),
            (and(token(9, 0, 0, 0.5)), "chunk 9, outside the partial"),
        ];
        for (tokens, what) in cases {
            let e = check_all(&of_tokens(tokens)).unwrap_err();
            assert!(
                e.contains(what) && e.contains("frequency_K8"),
                "{what}: {e}"
            );
        }
        let mut p = partial();
        p.base
            .insert(Group::text(Split::Fit, 1), BaseSums::default());
        let e = check_all(&p).unwrap_err();
        assert!(e.contains("no scored position"), "{e}");
        let mut p = partial();
        p.backends = vec!["x".repeat(100_000)];
        let e = check_all(&p).unwrap_err();
        assert!(e.contains("backend name") && e.len() < 1000, "{e}");
    }

    #[test]
    fn a_slice_with_another_sha256_is_refused_by_name() {
        let mut p = partial();
        p.candidates[0].sha256 = "d".repeat(64);
        let e = check(&p).unwrap_err();
        assert!(
            e.contains("candidate frequency_K8") && e.contains(&"d".repeat(64)),
            "{e}"
        );
    }

    #[test]
    fn partials_of_another_lease_model_corpus_or_setting_are_refused() {
        let cases: [(&str, Change); 14] = [
            ("generated (new tokens, noise micro-batch) (3, 1)", |p| {
                p.generate = (3, 1)
            }),
            ("0 generations for the lease's 2 prompts", |p| {
                p.candidates[0].generations.clear()
            }),
            (
                "noise floor: 1 generations for the lease's 2 prompts",
                |p| {
                    p.noise.remove(&0);
                },
            ),
            ("the job's prompt is 0 in domain 0 of 8 tokens", |p| {
                p.candidates[0]
                    .generations
                    .values_mut()
                    .for_each(|g| g.domain = 1)
            }),
            ("the job's prompt is 0 in domain 0 of 8 tokens", |p| {
                p.candidates[0]
                    .generations
                    .values_mut()
                    .for_each(|g| g.prompt_tokens = 7)
            }),
            ("the job's prompt is 2 in domain 1 of 5 tokens", |p| {
                let g = p.candidates[0].generations.remove(&2).unwrap();
                p.candidates[0].generations.insert(1, g);
            }),
            ("covers", |p| {
                p.chunks = vec![ChunkRange { start: 2, end: 3 }]
            }),
            ("base model", |p| p.base_sha256 = "x".into()),
            ("corpus", |p| p.corpus_sha256 = "x".into()),
            ("skip_first", |p| p.skip_first = 1),
            ("positions scored", |p| {
                p.candidates[0].groups.values_mut().for_each(|s| s.n = 1)
            }),
            ("per-position KL values", |p| {
                p.candidates[0].tokens.pop();
            }),
            ("disagree with its group sums", |p| {
                p.candidates[0]
                    .chunks
                    .values_mut()
                    .for_each(|s| s.top1_same = 1)
            }),
            ("outside the partial", |p| {
                let c = &mut p.candidates[0].chunks;
                let (key, s) = c.pop_first().unwrap();
                c.insert((9, key.1, key.2), s);
            }),
        ];
        for (what, change) in cases {
            let mut p = partial();
            change(&mut p);
            let e = check(&p).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
    }
}
