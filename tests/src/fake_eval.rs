//! A deterministic fake evaluation over the fake runs' corpus
//! ([`crate::loopback::fake_setup`]): the eval partial an honest worker of
//! one backend would return for a lease, without llama.cpp, for scripted
//! eval workers ([`crate::peer::Peer`]) honest or forging. The scored
//! positions are the worker's own ([`worker::eval::scored_positions`]);
//! the figures are made from (candidate, chunk, position), and every sum is
//! added from the per-position figures as the worker adds them, so a
//! forged figure comes with self-consistent sums.

use crate::loopback::{FAKE_MODEL, FAKE_N_CTX};
use numbers::eval::{CandidateResult, EvalPartial, Group, EVAL_FORMAT_VERSION};
use numbers::exact::ExactSum;
use numbers::ChunkRange;
use protocol::wire::EvalJob;
use runfiles::corpus::CorpusIndex;
use std::collections::BTreeMap;

/// One scored position of one candidate, as the partial reports it.
#[derive(Clone, Copy, Debug)]
pub struct Scored {
    /// Chunk id.
    pub chunk: u32,
    /// Position in the chunk.
    pub pos: u32,
    /// Its cluster: its span's corpus group ([`worker::eval::cluster_of`]).
    pub cluster: u32,
    /// Its group.
    pub group: Group,
    /// KL(p || q).
    pub kl: f64,
    /// The base model's NLL of the next token.
    pub nll_base: f64,
    /// The candidate's.
    pub nll: f64,
    /// Whether both pick the same top-1 token.
    pub top1_same: bool,
    /// q(next) - p(next).
    pub dprob: f64,
}

/// The per-position figures of one candidate as reported, made from the
/// honest ones before the sums are added (a forger's lie; the identity for
/// an honest worker).
pub type Forge = fn(Vec<Scored>) -> Vec<Scored>;

/// The honest figures of the scored positions of `range` for candidate
/// number `ci`.
fn scored(index: &CorpusIndex, job: &EvalJob, range: ChunkRange, ci: usize) -> Vec<Scored> {
    let mut out = Vec::new();
    for chunk in crate::chunks(index.n_chunks, FAKE_N_CTX)
        .into_iter()
        .filter(|c| range.contains(c.id.0))
    {
        let groups = worker::eval::scored_positions(&chunk, job.skip_first, &job.splits);
        for (pos, group) in groups.into_iter().enumerate() {
            let Some(group) = group else { continue };
            let (c, p, k) = (chunk.id.0 as u64, pos as u64, ci as u64 + 1);
            let kl = ((c * 7 + p * 3 + k * 11) % 13) as f64 / 64.0 * k as f64;
            let nll_base = 1.0 + (p % 5) as f64 / 10.0;
            out.push(Scored {
                chunk: chunk.id.0,
                pos: pos as u32,
                cluster: worker::eval::cluster_of(&chunk, pos),
                group,
                kl,
                nll_base,
                nll: nll_base + kl,
                top1_same: kl < 0.1,
                dprob: -kl / 10.0,
            });
        }
    }
    out
}

/// The fake evaluation's eval partial of `range` for `job` over the fake
/// corpus `index`, each candidate's figures changed by `forge` first.
pub fn fake_eval_partial(
    index: &CorpusIndex,
    job: &EvalJob,
    range: ChunkRange,
    forge: Forge,
) -> EvalPartial {
    let mut base: BTreeMap<Group, numbers::eval::BaseSums> = BTreeMap::new();
    let mut candidates = Vec::new();
    for (ci, cand) in job.candidates.iter().enumerate() {
        let figures = forge(scored(index, job, range, ci));
        let mut r = CandidateResult {
            name: cand.name.clone(),
            sha256: cand.sha256.clone(),
            k: numbers::keep_name::KeepMapName::parse(&cand.name).map_or(0, |n| n.k),
            groups: BTreeMap::new(),
            chunks: BTreeMap::new(),
            tokens: Vec::new(),
            generations: BTreeMap::new(),
        };
        // A value no exact sum holds (a forged NaN) is left out of every
        // sum alike, so the sums still agree with each other.
        let add = |s: &mut ExactSum, v: f64| {
            let _ = s.add_f64(v);
        };
        for f in &figures {
            if ci == 0 {
                let b = base.entry(f.group).or_default();
                b.n += 1;
                add(&mut b.nll, f.nll_base);
            }
            let s = r.groups.entry(f.group).or_default();
            s.n += 1;
            s.top1_same += u64::from(f.top1_same);
            add(&mut s.kl, f.kl);
            add(&mut s.kl_sq, f.kl * f.kl);
            add(&mut s.nll, f.nll);
            add(&mut s.dprob, f.dprob);
            let k = r.chunks.entry((f.chunk, f.cluster, f.group)).or_default();
            k.n += 1;
            k.top1_same += u64::from(f.top1_same);
            add(&mut k.kl, f.kl);
            add(&mut k.nll_base, f.nll_base);
            add(&mut k.nll, f.nll);
            add(&mut k.dprob, f.dprob);
            add(&mut k.dprob_sq, f.dprob * f.dprob);
            r.tokens.push(numbers::eval::TokenKl {
                chunk: f.chunk,
                pos: f.pos,
                cluster: f.cluster,
                group: f.group,
                kl: f.kl,
            });
        }
        candidates.push(r);
    }
    EvalPartial {
        format_version: EVAL_FORMAT_VERSION,
        base_sha256: FAKE_MODEL.into(),
        corpus_sha256: index.chunks_sha256.clone(),
        skip_first: job.skip_first,
        splits: job.splits.clone(),
        generate: job.generate.settings(),
        backends: vec!["scripted".into()],
        chunks: vec![range],
        base,
        candidates,
        noise: BTreeMap::new(),
    }
}
