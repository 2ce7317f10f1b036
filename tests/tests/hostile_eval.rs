//! A worker that holds the join secret and lies about the evaluation (issue
//! 53), over real loopback QUIC: scripted eval workers ([`fixtures::peer`])
//! return the fake evaluation's eval partials ([`fixtures::fake_eval`]),
//! honest or forged with self-consistent sums. Under `verify_fraction = 1`
//! a worker that reports KL 0 is contradicted and quarantined and the
//! summary is the honest run's; NaN, infinite and negative KL, a position
//! outside the lease and a foreign domain are each refused by name; a
//! worker quarantined in collection is refused in evaluation; a stored
//! eval partial that fails acceptance is set aside on resume.

use fixtures::fake_eval::{fake_eval_partial, Forge, Scored};
use fixtures::log::log_text;
use fixtures::loopback::{self, fake_setup, FAKE_N_CTX};
use fixtures::peer::{honest_partial, Peer};
use measure::eval::{evaluate, EvalOutcome, EvalSetup};
use numbers::eval::EvalPartial;
use numbers::exact::ExactSum;
use numbers::Split;
use protocol::wire::{EvalCandidate, EvalJob, Refusal, ToWorker};
use runfiles::layout::eval as names;
use runtime::run::crew::Crew;
use runtime::run::{Listening, RunError};
use std::path::Path;
use std::time::Duration;
use tokio::process::Child;

/// Chunks of the fake corpus: 6 eval leases of 3.
const N_CHUNKS: u32 = 18;

/// An evaluation of two candidates over the fake run of `N_CHUNKS` chunks
/// under `dir`, with `verify_fraction` of its leases checked twice.
fn eval_setup(dir: &Path, verify_fraction: f64) -> EvalSetup {
    let mut base = fake_setup(dir, N_CHUNKS);
    base.run.verify_fraction = verify_fraction;
    let candidate = |name: &str, sha: char| EvalCandidate {
        name: name.into(),
        keep_map: Some(format!("keep_maps/{name}.json")),
        sha256: sha.to_string().repeat(64),
        expert_used: None,
        quant: None,
    };
    EvalSetup {
        base,
        job: EvalJob {
            candidates: vec![candidate("frequency_K8", 'a'), candidate("reap_K4", 'b')],
            skip_first: FAKE_N_CTX / 4,
            splits: Split::ALL.to_vec(),
            models_in_memory: Default::default(),
            scratch_dir: None,
            generate: Default::default(),
        },
        out: runfiles::layout::EVAL,
        choice: Default::default(),
    }
}

fn honest(figures: Vec<Scored>) -> Vec<Scored> {
    figures
}

/// A scripted eval worker called `name`: joins, answers every eval lease
/// after `delay` with the fake evaluation forged by `forge`, until a reply
/// is neither a lease, a wait nor an Ack; that reply and the leases
/// answered.
async fn eval_worker(
    l: Listening,
    s: EvalSetup,
    name: &'static str,
    forge: Forge,
    delay: Duration,
) -> (Option<ToWorker>, u32) {
    let (mut p, _) = Peer::joined(&l, name).await;
    let mut answered = 0;
    loop {
        match p.poll_idle().await {
            Some(ToWorker::Lease(lease)) => {
                answered += 1;
                tokio::time::sleep(delay).await;
                let partial = fake_eval_partial(&s.base.index, &s.job, lease.range, forge);
                match p.done(&lease, partial.to_bytes()).await {
                    Some(ToWorker::Ack) => {}
                    other => return (other, answered),
                }
            }
            Some(ToWorker::Wait { retry_ms }) => {
                tokio::time::sleep(Duration::from_millis(retry_ms)).await
            }
            other => return (other, answered),
        }
    }
}

type Scripted = tokio::task::JoinHandle<(Option<ToWorker>, u32)>;

/// Evaluates `s` with the scripted workers `workers` (name, forge, delay
/// per lease) started once the server listens, each a moment after the one
/// before; the outcome and each worker's end.
async fn eval_with(
    s: &EvalSetup,
    workers: Vec<(&'static str, Forge, Duration)>,
) -> (EvalOutcome, Vec<(Option<ToWorker>, u32)>) {
    fixtures::log::captured_log();
    let mut handles: Vec<Scripted> = Vec::new();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        evaluate(s, |l| -> Result<Vec<Child>, RunError> {
            for (i, (name, forge, delay)) in workers.into_iter().enumerate() {
                let (l, s) = (l.clone(), s.clone());
                handles.push(tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(30 * i as u64)).await;
                    eval_worker(l, s, name, forge, delay).await
                }));
            }
            Ok(Vec::new())
        }),
    )
    .await
    .expect("the evaluation finishes in time")
    .expect("the evaluation succeeds");
    let mut ends = Vec::new();
    for h in handles {
        ends.push(
            tokio::time::timeout(Duration::from_secs(20), h)
                .await
                .expect("the scripted worker leaves")
                .unwrap(),
        );
    }
    (outcome, ends)
}

/// `eval/summary.json` and `eval/merged.bin` of an evaluation.
async fn results(s: &EvalSetup) -> Vec<(String, Vec<u8>)> {
    loopback::objects(
        &s.base.store,
        vec![names::SUMMARY_JSON.into(), names::MERGED.into()],
    )
    .await
}

/// The results of an honest evaluation of `s`'s corpus and job, made
/// under `dir` by one honest scripted worker.
async fn honest_results(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let s = eval_setup(dir, 0.0);
    eval_with(&s, vec![("honest", honest, Duration::ZERO)]).await;
    results(&s).await
}

fn kl_zero(mut figures: Vec<Scored>) -> Vec<Scored> {
    for f in &mut figures {
        (f.kl, f.nll, f.top1_same, f.dprob) = (0.0, f.nll_base, true, 0.0);
    }
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reporting_kl_zero_is_contradicted_quarantined_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let reference = honest_results(&d.path().join("honest")).await;
    let s = eval_setup(&d.path().join("lied"), 1.0);
    let slow = Duration::from_millis(60);
    let (o, ends) = eval_with(
        &s,
        vec![
            ("liar", kl_zero, Duration::ZERO),
            ("honest-0", honest, slow),
            ("honest-1", honest, slow),
        ],
    )
    .await;
    let (liar_end, reported) = &ends[0];
    assert!(*reported >= 1, "the liar reported an eval lease");
    assert!(
        matches!(liar_end, Some(ToWorker::Refused(Refusal::Quarantined(_)))),
        "{liar_end:?}"
    );
    assert!(o.leases.worker("liar").unwrap().quarantined, "{o:?}");
    assert_eq!(
        results(&s).await,
        reference,
        "the summary is the honest run's"
    );
    let log = log_text();
    assert!(
        log.contains("disagreed with two others")
            && (log.contains(": KL 0 and") || log.contains(" and 0)")),
        "the disagreement names the KL:\n{log}"
    );
}

fn nan_kl(mut figures: Vec<Scored>) -> Vec<Scored> {
    figures[0].kl = f64::NAN;
    figures
}

fn infinite_kl(mut figures: Vec<Scored>) -> Vec<Scored> {
    figures[0].kl = f64::INFINITY;
    figures
}

fn negative_kl(mut figures: Vec<Scored>) -> Vec<Scored> {
    figures[0].kl = -0.75;
    figures
}

/// One more position, past the end of the lease's first chunk.
fn position_outside(mut figures: Vec<Scored>) -> Vec<Scored> {
    let first = figures[0];
    let at = figures
        .iter()
        .position(|f| f.chunk != first.chunk)
        .unwrap_or(figures.len());
    figures.insert(
        at,
        Scored {
            pos: 100 * FAKE_N_CTX,
            ..figures[at - 1]
        },
    );
    figures
}

/// Every position in a domain the corpus does not hold.
fn foreign_domain(mut figures: Vec<Scored>) -> Vec<Scored> {
    for f in &mut figures {
        f.group.domain = 7;
    }
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_figures_are_each_refused_by_name_and_the_results_are_honest() {
    let d = tempfile::tempdir().unwrap();
    let reference = honest_results(&d.path().join("honest")).await;
    let cases: [(&str, Forge, &str); 5] = [
        ("nan", nan_kl, "per-position KL is NaN at chunk"),
        ("inf", infinite_kl, "per-position KL is infinite (inf)"),
        ("neg", negative_kl, "per-position KL is negative (-0.75)"),
        ("outside", position_outside, "position 3200 of chunk"),
        (
            "domain",
            foreign_domain,
            "domain 7 (not a domain of the corpus), the chunk holds",
        ),
    ];
    for (tag, forge, needle) in cases {
        let s = eval_setup(&d.path().join(tag), 0.0);
        let (o, ends) = eval_with(
            &s,
            vec![
                ("forger", forge, Duration::ZERO),
                ("honest", honest, Duration::from_millis(60)),
            ],
        )
        .await;
        let (end, reported) = &ends[0];
        assert!(*reported >= 1, "{tag}: the forger reported an eval lease");
        assert!(
            matches!(end, Some(ToWorker::Refused(Refusal::Quarantined(_)))),
            "{tag}: three refused results in a row quarantine it: {end:?}"
        );
        assert_eq!(o.leases.worker("forger").unwrap().leases, 0, "{tag}");
        assert_eq!(results(&s).await, reference, "{tag}");
        let log = log_text();
        assert!(
            log.contains(needle),
            "{tag}: the refusal says {needle:?}:\n{log}"
        );
    }
}

/// Issue 21's value no merge can hold: a collection partial refused at
/// acceptance.
fn huge_prob_sum(p: &mut numbers::partial::Partial) {
    let layer = &mut p.experts.groups.values_mut().next().unwrap().layers[0];
    layer.prob_sum[0] = ExactSum((1i128 << 126) - 1);
}

/// Logs in as `name` until the answer is neither a wait nor the collection
/// phase's refusal (collection may still be finishing): the answer of the
/// evaluation phase.
async fn answer_in_evaluation(l: &Listening, name: &str) -> ToWorker {
    for _ in 0..600 {
        let (mut p, mut answer) = Peer::login(l, name, l.secret.expose()).await;
        while matches!(answer, ToWorker::Wait { .. }) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            answer = p.poll_idle().await.expect("an answer to an idle poll");
        }
        match &answer {
            ToWorker::Refused(Refusal::Quarantined(why)) if !why.contains("earlier phase") => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            _ => return answer,
        }
    }
    panic!("no answer from the evaluation phase within 30 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_quarantined_in_collection_is_refused_in_evaluation() {
    fixtures::log::captured_log();
    let d = tempfile::tempdir().unwrap();
    let s = eval_setup(d.path(), 0.0);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (collect, eval) = (s.base.clone(), s.clone());
    let outcome = tokio::time::timeout(
        Duration::from_secs(90),
        runtime::run::runner::locked(&collect, |base| async move {
            let eval = EvalSetup {
                base: base.clone(),
                ..eval
            };
            let index = base.index.clone();
            let job_setup = eval.clone();
            let mut crew = Crew::new(move |l: &Listening| -> Result<Vec<Child>, RunError> {
                let l = l.clone();
                tokio::spawn(async move {
                    // An honest collection worker, slow enough that the
                    // poisoner gets leases too.
                    let (l2, i2) = (l.clone(), index.clone());
                    tokio::spawn(async move {
                        let (mut p, _) = Peer::joined(&l2, "collector").await;
                        p.work(|lease| {
                            std::thread::sleep(Duration::from_millis(40));
                            honest_partial(&i2, lease).to_bytes()
                        })
                        .await
                    });
                    let (mut p, _) = Peer::joined(&l, "poisoner").await;
                    let (end, _) = p
                        .work(|lease| {
                            let mut partial = honest_partial(&index, lease);
                            huge_prob_sum(&mut partial);
                            partial.to_bytes()
                        })
                        .await;
                    assert!(
                        matches!(end, Some(ToWorker::Refused(Refusal::Quarantined(_)))),
                        "quarantined in collection: {end:?}"
                    );
                    let answer = answer_in_evaluation(&l, "poisoner").await;
                    let _ = tx.send(answer);
                    // The evaluation's honest worker comes only now, so the
                    // evaluation was still open when the poisoner asked.
                    eval_worker(l, job_setup, "evaluator", honest, Duration::ZERO).await
                });
                Ok(Vec::new())
            });
            let collected = runtime::run::execute_locked(&base, &mut crew).await;
            let evaluated = match collected {
                Ok(_) => measure::eval::evaluate_locked(&eval, &mut crew)
                    .await
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            crew.close(&evaluated.as_ref().map(|_| ())).await;
            Ok::<_, RunError>(evaluated)
        }),
    )
    .await
    .expect("collection and evaluation finish in time")
    .unwrap();
    let o = outcome.expect("the evaluation succeeds");
    let answer = rx.await.unwrap();
    assert!(
        matches!(&answer, ToWorker::Refused(Refusal::Quarantined(why)) if why.contains("earlier phase")),
        "the evaluation refuses the poisoner: {answer:?}"
    );
    assert!(o.leases.worker("poisoner").is_none(), "{o:?}");
    assert_eq!(o.leases.worker("evaluator").unwrap().leases, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_eval_partial_that_fails_acceptance_is_set_aside_and_recomputed() {
    let d = tempfile::tempdir().unwrap();
    let s = eval_setup(d.path(), 0.0);
    eval_with(&s, vec![("honest", honest, Duration::ZERO)]).await;
    let clean = results(&s).await;
    // An eval partial an older coordinator accepted (its hash recorded),
    // with the NaN that made every later summary unreadable.
    let name = runfiles::layout::EVAL_PARTIALS.object(numbers::ChunkRange { start: 3, end: 6 });
    let mut p = EvalPartial::from_bytes(&s.base.store.get(&name).await.unwrap()).unwrap();
    p.candidates[1].tokens[0].kl = f64::NAN;
    let poisoned = p.to_bytes();
    s.base.store.put(&name, poisoned.clone()).await.unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&s.base.store.get("manifest.json").await.unwrap()).unwrap();
    manifest["eval_partials"][&name]["sha256"] = gguf::hash::sha256_hex(&poisoned).into();
    s.base
        .store
        .put("manifest.json", serde_json::to_vec(&manifest).unwrap())
        .await
        .unwrap();

    let (again, _) = eval_with(&s, vec![("honest", honest, Duration::ZERO)]).await;
    assert_eq!(
        (again.leases.resumed, again.leases.computed),
        (5, 1),
        "{again:?}"
    );
    let (aside, why) = &again.leases.rejected[0];
    assert_eq!(aside, &name);
    assert!(
        why.contains("candidate reap_K4") && why.contains("NaN"),
        "{why}"
    );
    let kept = s
        .base
        .store
        .list(runfiles::layout::REJECTED_DIR)
        .await
        .unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(kept[0].ends_with("part-00000003-00000006.bin"), "{kept:?}");
    assert_eq!(results(&s).await, clean);
}
