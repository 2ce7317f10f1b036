//! The hub in an evaluation run: the eval job in the welcome, and eval
//! results checked (hash, chunks, base model, corpus, settings, every
//! candidate's SHA-256 against the coordinator's own slice, and the sums'
//! own consistency) before the scheduler accepts them.

use super::Hub;
use crate::sched::{Completion, Scheduler};
use bytes::Bytes;
use common::eval::EvalPartial;
use common::peer_text::peer_text;
use common::secret::JoinSecret;
use common::store::RunStore;
use common::wire::{EvalJob, JobInfo, LeaseId, PartialRef, ToWorker, WorkerId};
use common::ChunkRange;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What makes a hub an evaluation hub.
#[derive(Debug)]
pub(super) struct EvalRole {
    job: EvalJob,
    corpus_sha256: String,
    deliveries: mpsc::UnboundedSender<EvalDelivery>,
}

/// An accepted eval result on its way to the merger.
#[derive(Debug)]
pub struct EvalDelivery {
    /// The worker that computed it.
    pub worker: WorkerId,
    /// Its chunks (one unit of the plan).
    pub range: ChunkRange,
    /// The decoded eval partial.
    pub partial: EvalPartial,
    /// Its encoded bytes (the merger stores them under the final name).
    pub bytes: Bytes,
    /// Their SHA-256.
    pub sha256: String,
    /// The staging object the worker wrote them to, when they did not come
    /// inline (removed once the bytes are stored under the final name).
    pub staged: Option<String>,
}

impl Hub {
    /// A hub for an evaluation run: workers are welcomed with `eval`, and
    /// accepted eval results come out of the returned receiver.
    /// `acceptance` only serves a stray collection result, which it refuses.
    pub fn new_eval(
        sched: Scheduler,
        secret: JoinSecret,
        job: JobInfo,
        acceptance: Arc<crate::run::accept::Acceptance>,
        run: RunStore,
        eval: EvalJob,
        corpus_sha256: String,
    ) -> (Hub, mpsc::UnboundedReceiver<EvalDelivery>) {
        let (mut hub, _no_collection_results) = Hub::new(sched, secret, job, acceptance, run);
        let (tx, rx) = mpsc::unbounded_channel();
        hub.eval = Some(EvalRole {
            job: eval,
            corpus_sha256,
            deliveries: tx,
        });
        (hub, rx)
    }

    /// The message that tells a joined worker its job.
    pub fn welcome(&self, worker_id: WorkerId) -> ToWorker {
        match &self.eval {
            None => ToWorker::Welcome {
                worker_id,
                job: self.job.clone(),
            },
            Some(role) => ToWorker::WelcomeEval {
                worker_id,
                job: self.job.clone(),
                eval: role.job.clone(),
            },
        }
    }

    /// Handles a finished eval lease like [`Hub::deliver`] handles a
    /// collection lease: a result that fails a check sends the lease back to
    /// the queue (one attempt used).
    pub async fn deliver_eval(
        &self,
        worker: WorkerId,
        lease: LeaseId,
        partial: PartialRef,
        sha256: String,
        elapsed_ms: u64,
    ) {
        let sha = &sha256;
        let check = move |range| async move {
            match &self.eval {
                Some(role) => self.check_eval(role, range, partial, sha).await,
                None => Err("an eval result in a collection run".to_string()),
            }
        };
        let Some((partial, bytes, staged)) =
            self.checked(worker, lease, "eval result", check).await
        else {
            return;
        };
        let now = self.now();
        let completion = self.sched().complete(lease, worker, &sha256, now);
        match completion {
            Completion::Accepted(range) => {
                self.credit(worker, partial.n_scored(), elapsed_ms);
                if let Some(role) = &self.eval {
                    let _ = role.deliveries.send(EvalDelivery {
                        worker,
                        range,
                        partial,
                        bytes,
                        sha256,
                        staged,
                    });
                }
            }
            Completion::Duplicate { range, same } => {
                tracing::info!(%worker, %range, same, "duplicate eval result dropped");
            }
            Completion::Opinion { range, .. } | Completion::Decide(range) => {
                // Eval runs lease with verify_fraction 0: never sampled.
                tracing::warn!(%worker, %range, "eval result of a sampled unit dropped");
            }
            Completion::Unknown => {
                tracing::warn!(%worker, %lease, "eval result for an unknown lease dropped")
            }
        }
    }

    async fn check_eval(
        &self,
        role: &EvalRole,
        range: ChunkRange,
        partial: PartialRef,
        sha256: &str,
    ) -> Result<(EvalPartial, Bytes, Option<String>), String> {
        let (bytes, staged) = self.fetch(partial, sha256, "eval partial").await?;
        let claimed = sha256.to_string();
        let base = self.job.model_sha256.clone();
        let corpus = role.corpus_sha256.clone();
        let job = role.job.clone();
        tokio::task::spawn_blocking(move || {
            super::check_hash(&bytes, &claimed, "eval partial")?;
            let p = EvalPartial::from_bytes(&bytes).map_err(|e| e.to_string())?;
            check_against_job(&p, range, &base, &corpus, &job)?;
            Ok((p, bytes, staged))
        })
        .await
        .map_err(|e| format!("checking the eval partial panicked: {e}"))?
    }
}

/// Whether an eval partial is the lease's: its chunks, the run's base model
/// and corpus, the job's settings, every candidate with the name and the
/// SHA-256 of the coordinator's slice, and sums that agree with themselves
/// (each candidate scored the base model's positions, one KL value each).
/// Serves results from workers and eval partials read back on resume.
pub fn check_against_job(
    p: &EvalPartial,
    range: ChunkRange,
    base_sha256: &str,
    corpus_sha256: &str,
    job: &EvalJob,
) -> Result<(), String> {
    if p.chunks != [range] {
        return Err(format!(
            "eval partial covers {}, the lease was {range}",
            common::peer_text::summarise(&p.chunks)
        ));
    }
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
            common::peer_text::summarise(&p.splits),
            job.skip_first,
            common::peer_text::summarise(&job.splits)
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use common::eval::{BaseSums, CandidateResult, CandidateSums, Group, TokenKl};
    use common::wire::EvalCandidate;
    use common::{ExactSum, Split};
    use std::collections::BTreeMap;

    const RANGE: ChunkRange = ChunkRange { start: 2, end: 4 };

    fn job() -> EvalJob {
        EvalJob {
            candidates: vec![EvalCandidate {
                name: "frequency_K8".into(),
                keep_map: "keep_maps/frequency_K8.json".into(),
                sha256: "c".repeat(64),
            }],
            skip_first: 0,
            splits: vec![Split::Fit],
        }
    }

    /// A partial of one candidate over two scored positions of one group.
    fn partial() -> EvalPartial {
        let group = Group {
            split: Split::Fit,
            domain: 0,
        };
        let token = |pos| TokenKl {
            chunk: 2,
            pos,
            group,
            kl: 0.5,
        };
        EvalPartial {
            format_version: common::eval::EVAL_FORMAT_VERSION,
            base_sha256: "b".repeat(64),
            corpus_sha256: "k".into(),
            skip_first: 0,
            splits: vec![Split::Fit],
            backends: vec!["cpu".into()],
            chunks: vec![RANGE],
            base: BTreeMap::from([(
                group,
                BaseSums {
                    n: 2,
                    nll: ExactSum::default(),
                },
            )]),
            candidates: vec![CandidateResult {
                name: "frequency_K8".into(),
                sha256: "c".repeat(64),
                k: 8,
                groups: BTreeMap::from([(
                    group,
                    CandidateSums {
                        n: 2,
                        ..CandidateSums::default()
                    },
                )]),
                tokens: vec![token(0), token(1)],
            }],
        }
    }

    /// Damages a partial in one way.
    type Change = fn(&mut EvalPartial);

    fn check(p: &EvalPartial) -> Result<(), String> {
        check_against_job(p, RANGE, &"b".repeat(64), "k", &job())
    }

    #[test]
    fn a_partial_of_the_job_passes() {
        check(&partial()).unwrap();
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
        let cases: [(&str, Change); 6] = [
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
        ];
        for (what, change) in cases {
            let mut p = partial();
            change(&mut p);
            let e = check(&p).unwrap_err();
            assert!(e.contains(what), "{what}: {e}");
        }
    }
}
