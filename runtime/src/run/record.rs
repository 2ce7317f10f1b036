//! The manifest's record of accepted results: for every per-lease result
//! the coordinator accepted, the SHA-256 of its stored bytes and the
//! settings key it was computed under (`manifest.json` → `partials`, or the
//! lease kind's own table). Resume and `verify` re-hash what they read
//! against it; only bytes with a record are ever reused.

use gguf::hash::sha256_hex;
use protocol::wire::JobOptions;
use runfiles::manifest::{self, ManifestError, RunManifest};
use runfiles::store::{RunStore, StoreError};

pub use runfiles::manifest::{PartialRecord, Records};

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Storage failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// `manifest.json` does not parse.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// A final partial appeared with bytes this coordinator did not accept.
    #[error("{url} appeared with other bytes while this coordinator ran: another process writes into this run")]
    Foreign {
        /// The object's URL.
        url: String,
    },
}

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

/// The table of one kind of result in a manifest.
pub type Table = fn(&mut RunManifest) -> &mut Records;

/// Keeps the manifest in memory and rewrites it whenever a record changes,
/// so the record is on storage before the next lease is merged.
#[derive(Debug)]
pub struct Recorder {
    store: RunStore,
    manifest: RunManifest,
    table: Table,
}

impl Recorder {
    /// Reads the run's manifest; records go to its `partials` table.
    pub async fn open(store: &RunStore) -> Result<Recorder, RecordError> {
        Recorder::open_table(store, |m| &mut m.partials).await
    }

    /// Reads the run's manifest; records go to `table` (each kind of lease
    /// keeps its own).
    pub async fn open_table(store: &RunStore, table: Table) -> Result<Recorder, RecordError> {
        Ok(Recorder {
            store: store.clone(),
            manifest: manifest::read_or_default(store).await?,
            table,
        })
    }

    /// The records as read or written so far.
    pub fn records(&mut self) -> Records {
        (self.table)(&mut self.manifest).clone()
    }

    /// Records the hash of accepted bytes, then stores them under their
    /// final `name` create-only, so bytes once stored are never replaced (a
    /// late or differing duplicate cannot overwrite them): bytes a worker
    /// `staged` are moved there by the store (a gigabyte not written again),
    /// others written, and a staged copy that was not moved is removed. The
    /// record goes first: every final object has its record whenever the
    /// process stops. Finding the very same bytes there already is fine;
    /// finding others is an error: another process writes into this run.
    pub async fn accept(
        &mut self,
        name: &str,
        bytes: &bytes::Bytes,
        staged: Option<&str>,
        rec: PartialRecord,
    ) -> Result<(), RecordError> {
        let sha = rec.sha256.clone();
        self.set(name, Some(rec)).await?;
        let moved = match staged {
            Some(from) => self.store.rename_new(from, name).await,
            None => Ok(false),
        };
        let stored = match moved {
            Ok(true) => return Ok(()),
            Ok(false) => self.store.put_new(name, bytes.clone()).await,
            Err(e) => Err(e),
        };
        match stored {
            Ok(()) => {}
            Err(StoreError::AlreadyExists { url }) => {
                let there = self.store.get(name).await?;
                if sha256_hex(&there) != sha {
                    return Err(RecordError::Foreign { url });
                }
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(from) = staged {
            self.store.delete(from).await?;
        }
        Ok(())
    }

    /// Removes the entry of `name` (its bytes were set aside) and writes the manifest.
    pub async fn forget(&mut self, name: &str) -> Result<(), RecordError> {
        self.set(name, None).await
    }

    async fn set(&mut self, name: &str, rec: Option<PartialRecord>) -> Result<(), RecordError> {
        let table = (self.table)(&mut self.manifest);
        match rec {
            Some(r) => {
                table.insert(name.to_string(), r);
            }
            None => {
                if table.remove(name).is_none() {
                    return Ok(());
                }
            }
        }
        manifest::write(&self.store, &self.manifest).await?;
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
            units: Vec::new(),
        }
    }

    #[tokio::test]
    async fn accepted_bytes_are_never_replaced_and_their_hash_is_recorded() {
        let d = tempfile::tempdir().unwrap();
        let store = RunStore::open(d.path().to_str().unwrap()).unwrap();
        store
            .put(
                runfiles::layout::MANIFEST_JSON,
                br#"{"model_sha256": "m"}"#.to_vec(),
            )
            .await
            .unwrap();
        let mut r = Recorder::open(&store).await.unwrap();
        let (a, b) = (
            bytes::Bytes::from_static(b"first"),
            bytes::Bytes::from_static(b"other"),
        );
        r.accept("partials/x.bin", &a, None, rec(&a)).await.unwrap();
        // The same bytes again (a restart between write and record): fine.
        r.accept("partials/x.bin", &a, None, rec(&a)).await.unwrap();
        let e = r
            .accept("partials/x.bin", &b, None, rec(&b))
            .await
            .unwrap_err();
        assert!(matches!(e, RecordError::Foreign { .. }), "{e}");
        // Staged bytes: never over stored ones either.
        store.put("staging/b.bin", b.clone()).await.unwrap();
        let staged = Some("staging/b.bin");
        let e = r
            .accept("partials/x.bin", &b, staged, rec(&b))
            .await
            .unwrap_err();
        assert!(matches!(e, RecordError::Foreign { .. }), "{e}");
        assert_eq!(store.get("partials/x.bin").await.unwrap(), a);
        // Staged bytes equal to the stored ones: fine, the staged copy goes.
        store.put("staging/a.bin", a.clone()).await.unwrap();
        r.accept("partials/x.bin", &a, Some("staging/a.bin"), rec(&a))
            .await
            .unwrap();
        assert!(!store.exists("staging/a.bin").await.unwrap());
        // Staged bytes are moved to their final name, not written again.
        r.accept("partials/y.bin", &b, staged, rec(&b))
            .await
            .unwrap();
        assert_eq!(store.get("partials/y.bin").await.unwrap(), b);
        assert!(!store.exists("staging/b.bin").await.unwrap());
        // The manifest keeps its other fields and holds the record.
        let mut again = Recorder::open(&store).await.unwrap();
        let m = manifest::read(&store).await.unwrap().unwrap();
        assert_eq!(m.corpus.model_sha256, "m");
        assert_eq!(again.records()["partials/x.bin"].settings, "s");
    }

    #[test]
    fn the_settings_key_changes_with_every_evaluation_setting() {
        let base = JobOptions {
            n_ubatch: 512,
            trace_every: protocol::wire::TraceStrides::both(1),
            trace_top_n: 64,
            trace_lookahead: vec![1, 2],
            decode_tokens: 0,
            decode_prompt: 32,
            f32_kv: false,
            flash_attn: false,
            merge_projection: 128,
        };
        let k = |o: &JobOptions| settings_key("m", "c", o);
        let variants = [
            JobOptions {
                n_ubatch: 256,
                ..base.clone()
            },
            JobOptions {
                trace_every: protocol::wire::TraceStrides::both(2),
                ..base.clone()
            },
            JobOptions {
                trace_every: protocol::wire::TraceStrides { fit: 1, heldout: 2 },
                ..base.clone()
            },
            JobOptions {
                trace_top_n: 8,
                ..base.clone()
            },
            JobOptions {
                trace_lookahead: vec![1],
                ..base.clone()
            },
            JobOptions {
                decode_tokens: 8,
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
            JobOptions {
                merge_projection: 0,
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
