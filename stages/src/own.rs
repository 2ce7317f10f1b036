//! Exploration never replaces results: `score`, `eval` and `replay` write a
//! run's own results (what the report and the next stages read) only with
//! the options its config gives, the ones `coordinator run` used; other
//! options need `--out NAME`, which writes under `explore/NAME/` instead.

use crate::StagesError;
use config::Config;
use runfiles::store::RunStore;
use std::fmt::Debug;

/// The config `coordinator run` recorded in the run's manifest; `None` when
/// the run has no manifest (statistics merged or written without `run`),
/// whose own options are every stage's defaults.
pub async fn recorded_config(store: &RunStore) -> Result<Option<Config>, StagesError> {
    let Some(manifest) = runfiles::manifest::read(store).await? else {
        return Ok(None);
    };
    manifest
        .config()
        .map(Some)
        .map_err(|problem| StagesError::Artifact {
            url: store.url_of(runfiles::layout::MANIFEST_JSON),
            problem: format!("its recorded config does not parse: {problem}"),
        })
}

/// Where a stage run with `--out NAME` writes: `explore/NAME/` in the run
/// (`None`: the run itself); a name that is not one is refused.
pub fn explore_output(store: &RunStore, name: Option<&str>) -> Result<RunStore, StagesError> {
    let Some(name) = name else {
        return Ok(store.clone());
    };
    Ok(store.child(&explore_prefix(name)?))
}

/// The prefix `explore/NAME/` of `--out NAME`; a name that is not one is
/// refused naming the flag.
pub fn explore_prefix(name: &str) -> Result<String, StagesError> {
    runfiles::layout::explore(name).ok_or_else(|| StagesError::Argument {
        argument: format!("--out {name}"),
        problem: runfiles::layout::EXPLORE_NAME_RULE.into(),
    })
}

/// The options asked for that differ from the run's own, each as
/// `FLAG ASKED (the run's: OWN)`.
#[derive(Debug, Default)]
pub struct Differences(Vec<String>);

impl Differences {
    /// Notes `flag` when the value asked for is not the run's own.
    pub fn check<T: PartialEq + Debug>(&mut self, flag: &str, asked: T, own: T) {
        if asked != own {
            self.0
                .push(format!("{flag} {asked:?} (the run's: {own:?})"));
        }
    }

    /// Nothing differs: the stage may write the run's own `outputs`;
    /// otherwise the refusal names each option and `--out`.
    pub fn allow(self, outputs: &str) -> Result<(), StagesError> {
        if self.0.is_empty() {
            return Ok(());
        }
        Err(StagesError::Exploring {
            outputs: outputs.to_string(),
            differences: self.0.join(", "),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_each_flag_and_the_way_out() {
        let mut same = Differences::default();
        same.check("--k", vec![8u32], vec![8]);
        assert!(same.allow("score/").is_ok());
        let mut d = Differences::default();
        d.check("--k", vec![4u32], vec![8, 16]);
        d.check("--seed", 0u64, 0);
        d.check(
            "--methods",
            vec!["frequency"],
            vec!["frequency", "reap_mean"],
        );
        let e = d.allow("score/ and keep_maps/").unwrap_err().to_string();
        assert!(
            e.starts_with("--k [4] (the run's: [8, 16]), --methods"),
            "{e}"
        );
        assert!(!e.contains("--seed"), "{e}");
        assert!(
            e.contains("score/ and keep_maps/") && e.contains("--out NAME"),
            "{e}"
        );
    }
}
