//! The manifest's record of accepted partials: for every per-lease partial
//! the coordinator accepted, the SHA-256 of its stored bytes and the
//! settings key it was computed under (`manifest.json` → `partials`). Resume
//! and `verify` re-hash what they read against it; only bytes with a record
//! are ever reused.

use common::hash::sha256_hex;
use common::store::{RunStore, StoreError};
use common::wire::JobOptions;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `manifest.json` or its record table does not parse.
    #[error("{url}: {reason}")]
    Manifest {
        /// The manifest's URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A final partial appeared with bytes this coordinator did not accept.
    #[error("{url} appeared with other bytes while this coordinator ran: another process writes into this run")]
    Foreign {
        /// The object's URL.
        url: String,
    },
}

/// Key of the record in `manifest.json`.
pub const MANIFEST_KEY: &str = "partials";

/// The most bytes of `manifest.json` read back (it holds the config, the
/// domain table, dropped documents and one record per lease).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// What the coordinator knew about an accepted partial when it stored it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialRecord {
    /// SHA-256 of the stored bytes.
    pub sha256: String,
    /// [`settings_key`] of the run that accepted it.
    pub settings: String,
}

/// Records of accepted partials by object name (`partials/part-...bin`).
pub type Records = BTreeMap<String, PartialRecord>;

/// Whether stored `bytes` may be reused: a record of their acceptance
/// exists, they still hash to it, and they were computed under the current
/// `settings` key. Why not, if not (for the log and `rejected/`).
pub fn check_stored(
    record: Option<&PartialRecord>,
    bytes: &[u8],
    settings: &str,
) -> Result<(), String> {
    let record = record.ok_or("no accepted SHA-256 is recorded for it in manifest.json")?;
    let sha = sha256_hex(bytes);
    if sha != record.sha256 {
        return Err(format!(
            "its bytes changed since they were accepted: SHA-256 {sha}, recorded {}",
            record.sha256
        ));
    }
    if record.settings != settings {
        return Err(format!(
            "it was computed under other settings (key {}, this run's is {settings})",
            record.settings
        ));
    }
    Ok(())
}

/// A fingerprint of everything that changes a partial's numbers: the model,
/// the tokenized corpus and how chunks are evaluated (micro-batch size, KV
/// cache type, flash attention, trace settings). Partials made under another
/// key are never merged with this run's.
pub fn settings_key(model_sha256: &str, corpus_sha256: &str, options: &JobOptions) -> String {
    let canonical = serde_json::json!({
        "model_sha256": model_sha256,
        "corpus_sha256": corpus_sha256,
        "options": options,
    });
    sha256_hex(canonical.to_string().as_bytes())
}

/// Reads `manifest.json` as JSON (an empty object when there is none); a
/// manifest that is too large or not a JSON object is an error naming it.
pub async fn read_manifest(store: &RunStore) -> Result<serde_json::Value, RecordError> {
    let name = crate::corpus::MANIFEST_FILE;
    let Some(bytes) = store.get_opt_limited(name, MAX_MANIFEST_BYTES).await? else {
        return Ok(serde_json::json!({}));
    };
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) if v.is_object() => Ok(v),
        Ok(_) => Err(RecordError::Manifest {
            url: store.url_of(name),
            reason: "not a JSON object".into(),
        }),
        Err(e) => Err(RecordError::Manifest {
            url: store.url_of(name),
            reason: format!("not valid JSON: {e}"),
        }),
    }
}

/// The records of a manifest (none when it has no `partials` key); a record
/// table that does not parse is an error naming the manifest.
pub fn records_of(store: &RunStore, manifest: &serde_json::Value) -> Result<Records, RecordError> {
    records_in(store, manifest, MANIFEST_KEY)
}

/// The records under `key` of a manifest (`partials`, or another stage's
/// table such as `eval_partials`); none when the key is absent.
pub fn records_in(
    store: &RunStore,
    manifest: &serde_json::Value,
    key: &str,
) -> Result<Records, RecordError> {
    match manifest.get(key) {
        None => Ok(Records::new()),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| RecordError::Manifest {
            url: store.url_of(crate::corpus::MANIFEST_FILE),
            reason: format!("`{key}` is not a table of partial records: {e}"),
        }),
    }
}

/// Keeps the manifest in memory and rewrites it whenever a record changes,
/// so the record is on storage before the next lease is merged.
#[derive(Debug)]
pub struct Recorder {
    store: RunStore,
    manifest: serde_json::Value,
    key: &'static str,
}

impl Recorder {
    /// Reads the run's manifest; records go to its `partials` table.
    pub async fn open(store: &RunStore) -> Result<Recorder, RecordError> {
        Recorder::open_table(store, MANIFEST_KEY).await
    }

    /// Reads the run's manifest; records go to its `key` table (each stage
    /// that leases work keeps its own).
    pub async fn open_table(store: &RunStore, key: &'static str) -> Result<Recorder, RecordError> {
        Ok(Recorder {
            store: store.clone(),
            manifest: read_manifest(store).await?,
            key,
        })
    }

    /// The records as read or written so far.
    pub fn records(&self) -> Result<Records, RecordError> {
        records_in(&self.store, &self.manifest, self.key)
    }

    /// Records the hash of accepted bytes, then stores them under their
    /// final `name` with a create-only write, so bytes once stored are never
    /// replaced (a late or differing duplicate cannot overwrite them). The
    /// record goes first: every final object has its record whenever the
    /// process stops. Finding the very same bytes there already is fine;
    /// finding others is an error: another process writes into this run.
    pub async fn accept(
        &mut self,
        name: &str,
        bytes: &bytes::Bytes,
        rec: PartialRecord,
    ) -> Result<(), RecordError> {
        let sha = rec.sha256.clone();
        self.set(name, Some(rec)).await?;
        match self.store.put_new(name, bytes.clone()).await {
            Ok(()) => Ok(()),
            Err(StoreError::AlreadyExists { url }) => {
                let there = self.store.get(name).await?;
                if sha256_hex(&there) == sha {
                    Ok(())
                } else {
                    Err(RecordError::Foreign { url })
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Removes the entry of `name` (its bytes were set aside) and writes the manifest.
    pub async fn forget(&mut self, name: &str) -> Result<(), RecordError> {
        self.set(name, None).await
    }

    async fn set(&mut self, name: &str, rec: Option<PartialRecord>) -> Result<(), RecordError> {
        let table = self
            .manifest
            .as_object_mut()
            .expect("read_manifest returns an object")
            .entry(self.key)
            .or_insert_with(|| serde_json::json!({}));
        if !table.is_object() {
            *table = serde_json::json!({});
        }
        let table = table.as_object_mut().expect("an object");
        match rec {
            Some(r) => {
                table.insert(
                    name.to_string(),
                    serde_json::to_value(r).expect("a record encodes"),
                );
            }
            None => {
                if table.remove(name).is_none() {
                    return Ok(());
                }
            }
        }
        let bytes = serde_json::to_vec_pretty(&self.manifest).expect("JSON encodes");
        self.store.put(crate::corpus::MANIFEST_FILE, bytes).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(bytes: &[u8]) -> PartialRecord {
        PartialRecord {
            sha256: sha256_hex(bytes),
            settings: "s".into(),
        }
    }

    #[tokio::test]
    async fn accepted_bytes_are_never_replaced_and_their_hash_is_recorded() {
        let d = tempfile::tempdir().unwrap();
        let store = RunStore::open(d.path().to_str().unwrap()).unwrap();
        store
            .put(
                crate::corpus::MANIFEST_FILE,
                br#"{"model_sha256": "m"}"#.to_vec(),
            )
            .await
            .unwrap();
        let mut r = Recorder::open(&store).await.unwrap();
        let (a, b) = (
            bytes::Bytes::from_static(b"first"),
            bytes::Bytes::from_static(b"other"),
        );
        r.accept("partials/x.bin", &a, rec(&a)).await.unwrap();
        // The same bytes again (a restart between write and record): fine.
        r.accept("partials/x.bin", &a, rec(&a)).await.unwrap();
        let e = r.accept("partials/x.bin", &b, rec(&b)).await.unwrap_err();
        assert!(matches!(e, RecordError::Foreign { .. }), "{e}");
        assert_eq!(store.get("partials/x.bin").await.unwrap(), a);
        // The manifest keeps its other fields and holds the record.
        let again = Recorder::open(&store).await.unwrap();
        let m = read_manifest(&store).await.unwrap();
        assert_eq!(m["model_sha256"], "m");
        assert_eq!(again.records().unwrap()["partials/x.bin"].settings, "s");
    }

    #[test]
    fn the_settings_key_changes_with_every_evaluation_setting() {
        let base = JobOptions {
            n_ubatch: 512,
            trace_every: common::wire::TraceStrides::both(1),
            trace_top_n: 64,
            f32_kv: false,
            flash_attn: false,
        };
        let k = |o: &JobOptions| settings_key("m", "c", o);
        let variants = [
            JobOptions {
                n_ubatch: 256,
                ..base.clone()
            },
            JobOptions {
                trace_every: common::wire::TraceStrides::both(2),
                ..base.clone()
            },
            JobOptions {
                trace_every: common::wire::TraceStrides { fit: 1, heldout: 2 },
                ..base.clone()
            },
            JobOptions {
                trace_top_n: 8,
                ..base.clone()
            },
            JobOptions {
                f32_kv: true,
                ..base.clone()
            },
            JobOptions {
                flash_attn: true,
                ..base.clone()
            },
        ];
        let mut keys: Vec<String> = variants.iter().map(k).collect();
        keys.push(k(&base));
        keys.push(settings_key("m2", "c", &base));
        keys.push(settings_key("m", "c2", &base));
        let unique: std::collections::BTreeSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len());
        assert_eq!(k(&base), k(&base.clone()));
    }
}
