//! The layout of a run location: every object name and prefix under a run,
//! and the environment variables the processes of a run pass to each
//! other, in one place (DESIGN section 10). Stages name what they read and
//! write through this module only.

use numbers::split::ChunkRange;

/// What the run was computed from; the corpus stage writes it last.
pub const MANIFEST_JSON: &str = "manifest.json";
/// The run-location lock of the coordinator that writes to the run.
pub const LOCK_FILE: &str = "run.lock";
/// The tokenized corpus (its objects are named in [`corpus`]).
pub const CORPUS_DIR: &str = "corpus";
/// Merged statistics, JSON.
pub const SALIENCY_JSON: &str = "saliency.json";
/// The same numbers as a Parquet table.
pub const SALIENCY_PARQUET: &str = "saliency.parquet";
/// llama.cpp importance matrix.
pub const IMATRIX_GGUF: &str = "imatrix.gguf";
/// Partials: one per lease ([`PARTIALS`]) and the merged one.
pub const PARTIALS_DIR: &str = PARTIALS.dir;
/// The merged partial, for resuming and re-deriving.
pub const MERGED_PARTIAL: &str = "partials/merged.bin";
/// Routing trace parts (Parquet) of teacher-forced prefill.
pub const TRACE_DIR: &str = "trace";
/// Trace parts of tokens the model generated itself (under [`TRACE_DIR`]).
pub const DECODE_TRACE_DIR: &str = "trace/decode";
/// Keep maps, `<method>_K<k>.json` ([`keep_map`]).
pub const KEEP_MAPS_DIR: &str = "keep_maps";
/// Replay results as JSON (`replay::results` is the schema).
pub const REPLAY_RESULTS_JSON: &str = "replay/results.json";
/// Replay tables as Markdown.
pub const REPLAY_REPORT_MD: &str = "replay/report.md";
/// The run report; its PNG plots lie beside it under [`REPORT_DIR`].
pub const REPORT_MD: &str = "report/report.md";
/// Directory of the run report and its plots.
pub const REPORT_DIR: &str = "report";
/// Every miss-rate curve of the report's replay figures, as drawn
/// (`stages::report::replay` is the schema).
pub const REPORT_MISS_RATES_JSON: &str = "report/miss_rate.json";

/// Object name of the keep map called `name` (`frequency_K8`).
pub fn keep_map(name: &str) -> String {
    format!("{KEEP_MAPS_DIR}/{name}.json")
}

/// Inverse of [`keep_map`]: the name of the keep map stored as `object`;
/// a bare name is returned as it is.
pub fn keep_map_name(object: &str) -> &str {
    let name = object.strip_prefix(KEEP_MAPS_DIR).unwrap_or(object);
    let name = name.strip_prefix('/').unwrap_or(name);
    name.strip_suffix(".json").unwrap_or(name)
}

/// Prefix of exploratory outputs: `score`, `eval` and `replay` with
/// `--out NAME` write under `explore/NAME/` (their usual layout there),
/// never over the run's own results.
pub const EXPLORE_DIR: &str = "explore";

/// What an exploratory output's name must be (errors quote it).
pub const EXPLORE_NAME_RULE: &str =
    "must be a name of letters, digits, '_', '-' and '.', not starting with '.'";

/// The prefix `explore/NAME` of the exploratory output `name`; `None`
/// when the name breaks [`EXPLORE_NAME_RULE`].
pub fn explore(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    ok.then(|| format!("{EXPLORE_DIR}/{name}"))
}

/// Object name of a trace part of `range`; decode parts go to
/// [`DECODE_TRACE_DIR`].
pub fn trace_part(range: ChunkRange, decode: bool) -> String {
    let dir = if decode { DECODE_TRACE_DIR } else { TRACE_DIR };
    format!("{dir}/part-{:08}-{:08}.parquet", range.start, range.end)
}

/// Objects of the tokenized corpus, relative to [`CORPUS_DIR`] (a worker
/// opens the corpus location itself).
pub mod corpus {
    /// The chunk table.
    pub const CHUNKS_FILE: &str = "chunks.parquet";
    /// The corpus index.
    pub const INDEX_FILE: &str = "index.json";
    /// Where every document went and why, one JSON line each.
    pub const DOCUMENTS_FILE: &str = "documents.jsonl";
    /// The images the chunks carry, one object per image, by content.
    pub const IMAGES_DIR: &str = "images";

    /// Object name of the image whose bytes have SHA-256 `sha256` (hex).
    pub fn image(sha256: &str) -> String {
        format!("{IMAGES_DIR}/{sha256}")
    }
}

/// Objects written by `coordinator score` (besides the keep maps).
pub mod score {
    /// The whole score report as JSON.
    pub const REPORT_JSON: &str = "score/score.json";
    /// The tables as Markdown.
    pub const TABLES_MD: &str = "score/tables.md";
    /// Per-layer rows of every (method, K) as Parquet.
    pub const TABLES_PARQUET: &str = "score/tables.parquet";
}

/// Objects of an evaluation (its per-lease partials: [`super::EVAL_PARTIALS`]).
pub mod eval {
    /// Merged eval partial, for resuming and re-deriving.
    pub const MERGED: &str = "eval/merged.bin";
    /// The figures, JSON.
    pub const SUMMARY_JSON: &str = "eval/summary.json";
    /// The same figures as a Parquet table, one row per (candidate, split, domain).
    pub const SUMMARY_PARQUET: &str = "eval/summary.parquet";
    /// The report's plot of held-out KL against K.
    pub const KL_PLOT: &str = "report/eval_kl_vs_k.png";
    /// The report's plot of held-out KL against K in the domain that binds
    /// each method's KL budget pick.
    pub const KL_BINDING_PLOT: &str = "report/eval_kl_binding.png";
}

/// Where one evaluation's objects live under a run: its per-lease eval
/// partials, their merge and the summary. `coordinator eval` writes
/// [`EVAL`] (under `eval/`), `coordinator ship` [`SHIP_EVAL`] (under
/// `ship/eval/`), so shipping never replaces the run's evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvalLayout {
    /// The per-lease eval partials.
    pub partials: LeaseLayout,
    /// Merged eval partial.
    pub merged: &'static str,
    /// The figures, JSON (written last: it marks the set complete).
    pub summary_json: &'static str,
    /// The same figures as a Parquet table.
    pub summary_parquet: &'static str,
}

/// `coordinator eval`'s objects, under `eval/`.
pub const EVAL: EvalLayout = EvalLayout {
    partials: EVAL_PARTIALS,
    merged: eval::MERGED,
    summary_json: eval::SUMMARY_JSON,
    summary_parquet: eval::SUMMARY_PARQUET,
};

impl EvalLayout {
    /// [`EVAL`]'s objects under `prefix` (`explore/NAME` for `coordinator
    /// eval --out NAME`). The names are leaked to be `'static` like the
    /// constant layouts': a command makes one, for its whole life.
    pub fn under(prefix: &str) -> EvalLayout {
        let leak =
            |name: &str| -> &'static str { Box::leak(format!("{prefix}/{name}").into_boxed_str()) };
        EvalLayout {
            partials: LeaseLayout {
                dir: leak(EVAL.partials.dir),
            },
            merged: leak(EVAL.merged),
            summary_json: leak(EVAL.summary_json),
            summary_parquet: leak(EVAL.summary_parquet),
        }
    }
}

/// The evaluation of shipped files by `coordinator ship`, under `ship/eval/`.
pub const SHIP_EVAL: EvalLayout = EvalLayout {
    partials: LeaseLayout {
        dir: "ship/eval/partials",
    },
    merged: "ship/eval/merged.bin",
    summary_json: "ship/eval/summary.json",
    summary_parquet: "ship/eval/summary.parquet",
};

/// Environment variables the processes of a run read.
pub mod env {
    /// The join secret, when no secret file is given.
    pub const JOIN_SECRET: &str = "MOE_CENSUS_JOIN_SECRET";
    /// The worker binary local workers are started from.
    pub const WORKER_BIN: &str = "MOE_CENSUS_WORKER_BIN";
    /// Where a worker reduces observed tensors when `--reduce` is not given.
    pub const REDUCE: &str = "MOE_CENSUS_REDUCE";

    /// Whether the binaries' logs are coloured: only on a terminal, and
    /// not when `NO_COLOR` is set (a log file or a pipe gets plain text).
    pub fn log_colour() -> bool {
        use std::io::IsTerminal;
        std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
    }
}

/// Where one kind of lease result lives under a run:
/// `<dir>/part-<start>-<end>.bin`, eight digits each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLayout {
    /// Prefix of the per-lease objects.
    pub dir: &'static str,
}

/// Collection partials: `partials/part-*.bin`.
pub const PARTIALS: LeaseLayout = LeaseLayout { dir: "partials" };

/// Eval partials: `eval/partials/part-*.bin`.
pub const EVAL_PARTIALS: LeaseLayout = LeaseLayout {
    dir: "eval/partials",
};

/// Response partials of the response phase:
/// `corpus/responses/partials/part-*.bin` (prompt ranges).
pub const RESPONSE_PARTIALS: LeaseLayout = LeaseLayout {
    dir: "corpus/responses/partials",
};

impl LeaseLayout {
    /// Object name of the result of a chunk range.
    pub fn object(&self, range: ChunkRange) -> String {
        format!("{}/part-{:08}-{:08}.bin", self.dir, range.start, range.end)
    }

    /// Inverse of [`LeaseLayout::object`]; `None` for other objects.
    pub fn parse(&self, name: &str) -> Option<ChunkRange> {
        let rest = name
            .strip_prefix(self.dir)?
            .strip_prefix("/part-")?
            .strip_suffix(".bin")?;
        let (a, b) = rest.split_once('-')?;
        let range = ChunkRange {
            start: a.parse().ok()?,
            end: b.parse().ok()?,
        };
        (!range.is_empty() && self.object(range) == name).then_some(range)
    }
}

/// Prefix under the run of results workers stored instead of sending them
/// inline; the coordinator copies accepted ones to their final names.
pub const STAGING_DIR: &str = "staging";

/// Object name under the run where a worker stores a result too large to
/// send inline: named by its SHA-256 (64 hex digits, else `None`), never by
/// its chunk range, so only the coordinator writes final results.
pub fn staged(sha256: &str) -> Option<String> {
    (sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("{STAGING_DIR}/{sha256}.bin"))
}

/// Prefix under the run where unusable stored results are moved.
pub const REJECTED_DIR: &str = "rejected";

/// Where a stored result that cannot be reused is moved:
/// `rejected/<first 16 hex digits of its SHA-256>-<file name>`.
pub fn rejected(name: &str, sha256: &str) -> String {
    let file = name.rsplit('/').next().unwrap_or(name);
    format!("{REJECTED_DIR}/{}-{file}", &sha256[..16.min(sha256.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exploratory_outputs_are_named_under_explore() {
        assert_eq!(explore("scratch").as_deref(), Some("explore/scratch"));
        assert_eq!(explore("k-25.v2").as_deref(), Some("explore/k-25.v2"));
        for bad in ["", ".", "..", "../x", "a/b", "a b", ".hidden"] {
            assert_eq!(explore(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_names_of_their_own_kind_parse() {
        let r = ChunkRange { start: 4, end: 6 };
        assert_eq!(PARTIALS.object(r), "partials/part-00000004-00000006.bin");
        assert_eq!(EVAL_PARTIALS.parse(&EVAL_PARTIALS.object(r)), Some(r));
        assert_eq!(PARTIALS.parse(&PARTIALS.object(r)), Some(r));
        assert_eq!(
            EVAL_PARTIALS.parse("eval/partials/part-00000004-00000004.bin"),
            None
        );
        assert_eq!(
            EVAL_PARTIALS.parse("partials/part-00000004-00000006.bin"),
            None
        );
        assert_eq!(
            PARTIALS.parse("eval/partials/part-00000004-00000006.bin"),
            None
        );
        assert_eq!(EVAL_PARTIALS.parse("eval/partials/part-4-6.bin"), None);
        assert_eq!(PARTIALS.parse("partials/merged.bin"), None);
        assert_eq!(keep_map_name(&keep_map("frequency_K8")), "frequency_K8");
        assert_eq!(keep_map_name("frequency_K8"), "frequency_K8");
        assert_eq!(
            rejected("partials/part-00000004-00000006.bin", &"ab".repeat(32)),
            format!("rejected/{}-part-00000004-00000006.bin", "ab".repeat(8))
        );
    }

    #[test]
    fn partial_and_staged_names_parse() {
        let r = ChunkRange { start: 8, end: 16 };
        assert_eq!(PARTIALS.parse(&PARTIALS.object(r)), Some(r));
        assert_eq!(PARTIALS.parse("partials/merged.bin"), None);
        let sha = "ab".repeat(32);
        assert_eq!(staged(&sha), Some(format!("staging/{sha}.bin")));
        assert_eq!(staged("../../etc/passwd"), None);
    }
}
