//! Reading source files (JSONL, Parquet, plain text) into records: plain text
//! or chat messages, each with its location and optional group key.

use super::chat::{Message, Role};
use super::error::CorpusError;
use crate::config::{SourceConfig, SourceFormat};
use arrow::array::{Array, AsArray, RecordBatch, StringArray};
use arrow::datatypes::DataType;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::path::Path;

/// What a record holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// Plain text, tokenized as is.
    Text(String),
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
}

/// One document as read from a source.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Where it came from (`path:LINE`, `path (row N)`, `path (document N)`),
    /// with the source's path as the config names it (relative to the
    /// config's directory), so the location, and the group and order derived
    /// from it, do not depend on the directory the command runs in.
    pub at: String,
    /// The document.
    pub content: Content,
    /// Value of the group key field, when the record has one.
    pub group: Option<String>,
}

/// A source file read whole.
#[derive(Clone, Debug)]
pub struct SourceData {
    /// SHA-256 of the file's bytes.
    pub sha256: String,
    /// File size in bytes.
    pub bytes: u64,
    /// Its records, in file order.
    pub records: Vec<Record>,
}

/// Hashes a source file without parsing it (for the inputs fingerprint).
pub fn hash_file(path: &Path) -> Result<String, CorpusError> {
    let bytes = read(path)?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

fn read(path: &Path) -> Result<Vec<u8>, CorpusError> {
    std::fs::read(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a source at `path` (already resolved) as `cfg` describes. Records
/// are located by `cfg.path` (the config's own spelling); errors name the
/// resolved `path`, which a user can open from where they ran the command.
pub fn read_source(
    cfg: &SourceConfig,
    path: &Path,
    group_key: Option<&str>,
) -> Result<SourceData, CorpusError> {
    let bytes = read(path)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let size = bytes.len() as u64;
    let records = match cfg.format() {
        SourceFormat::Jsonl => read_jsonl(cfg, path, &bytes, group_key)?,
        SourceFormat::Parquet => read_parquet(cfg, path, bytes, group_key)?,
        SourceFormat::Text => read_text(cfg, path, &bytes)?,
    };
    Ok(SourceData {
        sha256,
        bytes: size,
        records,
    })
}

fn read_text(cfg: &SourceConfig, path: &Path, bytes: &[u8]) -> Result<Vec<Record>, CorpusError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CorpusError::Source {
        path: path.to_path_buf(),
        message: format!("not UTF-8 text ({e})"),
    })?;
    let pieces: Vec<&str> = match &cfg.separator {
        Some(sep) if !sep.is_empty() => text.split(sep.as_str()).collect(),
        _ => vec![text],
    };
    Ok(pieces
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .enumerate()
        .map(|(i, p)| Record {
            at: format!("{} (document {})", cfg.path.display(), i + 1),
            content: Content::Text(p.to_string()),
            group: None,
        })
        .collect())
}

fn read_jsonl(
    cfg: &SourceConfig,
    path: &Path,
    bytes: &[u8],
    group_key: Option<&str>,
) -> Result<Vec<Record>, CorpusError> {
    let text = std::str::from_utf8(bytes).map_err(|e| CorpusError::Source {
        path: path.to_path_buf(),
        message: format!("not UTF-8 text ({e})"),
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", cfg.path.display(), i + 1);
        let bad = |message: String| CorpusError::Record {
            at: format!("{}:{}", path.display(), i + 1),
            message,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| bad(format!("malformed JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| bad("record is not a JSON object".into()))?;
        let content = if let Some(t) = obj.get(&cfg.text_field) {
            Content::Text(
                t.as_str()
                    .ok_or_else(|| bad(format!("field {:?} is not a string", cfg.text_field)))?
                    .to_string(),
            )
        } else if let Some(m) = obj.get(&cfg.messages_field) {
            Content::Chat(messages_from_json(m).map_err(bad)?)
        } else {
            return Err(bad(format!(
                "record has neither a {:?} nor a {:?} field",
                cfg.text_field, cfg.messages_field
            )));
        };
        let group = group_key.and_then(|k| obj.get(k)).and_then(|g| match g {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        });
        out.push(Record { at, content, group });
    }
    Ok(out)
}

fn messages_from_json(value: &Value) -> Result<Vec<Message>, String> {
    let items = value
        .as_array()
        .ok_or("messages are not a JSON array of {role, content}")?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let role = m.get("role").and_then(Value::as_str);
            let content = m.get("content").and_then(Value::as_str);
            match (role, content) {
                (Some(r), Some(c)) => Ok(Message {
                    role: Role::parse(r).map_err(|e| format!("message {}: {e}", i + 1))?,
                    content: c.to_string(),
                }),
                _ => Err(format!(
                    "message {} lacks a string \"role\" or \"content\"",
                    i + 1
                )),
            }
        })
        .collect()
}

fn read_parquet(
    cfg: &SourceConfig,
    path: &Path,
    bytes: Vec<u8>,
    group_key: Option<&str>,
) -> Result<Vec<Record>, CorpusError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let fail = |message: String| CorpusError::Source {
        path: path.to_path_buf(),
        message,
    };
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
        .map_err(|e| fail(format!("not a readable Parquet file ({e})")))?;
    let schema = builder.schema().clone();
    let has = |name: &str| schema.column_with_name(name).is_some();
    if !has(&cfg.text_field) && !has(&cfg.messages_field) {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        return Err(fail(format!(
            "Parquet file has no text column {:?} (nor a messages column {:?}); its columns are: {}",
            cfg.text_field,
            cfg.messages_field,
            names.join(", ")
        )));
    }
    let reader = builder.build().map_err(|e| fail(e.to_string()))?;
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| fail(format!("cannot decode Parquet ({e})")))?;
        let base = out.len();
        let row_of =
            |source: &Path, row: usize| format!("{} (row {})", source.display(), base + row + 1);
        let at = |row: usize| row_of(&cfg.path, row);
        let shown = |row: usize| row_of(path, row);
        let groups = match group_key.filter(|k| has(k)) {
            Some(k) => Some(string_column(&batch, k).map_err(&fail)?),
            None => None,
        };
        let group = |row: usize| {
            groups
                .as_ref()
                .filter(|g| g.is_valid(row))
                .map(|g| g.value(row).to_string())
        };
        if has(&cfg.text_field) {
            let text = string_column(&batch, &cfg.text_field).map_err(&fail)?;
            for row in 0..batch.num_rows() {
                if text.is_null(row) {
                    return Err(CorpusError::Record {
                        at: shown(row),
                        message: format!("column {:?} is null", cfg.text_field),
                    });
                }
                out.push(Record {
                    at: at(row),
                    content: Content::Text(text.value(row).to_string()),
                    group: group(row),
                });
            }
        } else {
            let messages = messages_column(&batch, &cfg.messages_field).map_err(&fail)?;
            for (row, m) in messages.into_iter().enumerate() {
                let m = m.map_err(|message| CorpusError::Record {
                    at: shown(row),
                    message,
                })?;
                out.push(Record {
                    at: at(row),
                    content: Content::Chat(m),
                    group: group(row),
                });
            }
        }
    }
    Ok(out)
}

fn string_column(batch: &RecordBatch, name: &str) -> Result<StringArray, String> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name:?}"))?;
    let cast = arrow::compute::cast(col, &DataType::Utf8).map_err(|e| {
        format!(
            "column {name:?} of type {} is not text ({e})",
            col.data_type()
        )
    })?;
    Ok(cast.as_string::<i32>().clone())
}

/// A messages column: JSON text, or a list of structs with `role` and `content`.
fn messages_column(
    batch: &RecordBatch,
    name: &str,
) -> Result<Vec<Result<Vec<Message>, String>>, String> {
    let col = batch
        .column_by_name(name)
        .ok_or_else(|| format!("no column {name:?}"))?;
    let rows = 0..batch.num_rows();
    match col.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            let list = arrow::compute::cast(col, &DataType::List(list_item(col.data_type())))
                .map_err(|e| e.to_string())?;
            let list = list.as_list::<i32>();
            Ok(rows
                .map(|row| {
                    let items = list.value(row);
                    let items = items.as_struct_opt().ok_or_else(|| {
                        format!("column {name:?} is not a list of {{role, content}}")
                    })?;
                    let field = |f: &str| -> Result<StringArray, String> {
                        let c = items
                            .column_by_name(f)
                            .ok_or_else(|| format!("column {name:?} items lack field {f:?}"))?;
                        let c =
                            arrow::compute::cast(c, &DataType::Utf8).map_err(|e| e.to_string())?;
                        Ok(c.as_string::<i32>().clone())
                    };
                    let (roles, contents) = (field("role")?, field("content")?);
                    (0..items.len())
                        .map(|i| {
                            Ok(Message {
                                role: Role::parse(roles.value(i))
                                    .map_err(|e| format!("message {}: {e}", i + 1))?,
                                content: contents.value(i).to_string(),
                            })
                        })
                        .collect()
                })
                .collect())
        }
        _ => {
            let text = string_column(batch, name)?;
            Ok(rows
                .map(|row| {
                    let v: Value = serde_json::from_str(text.value(row))
                        .map_err(|e| format!("column {name:?} is not JSON messages ({e})"))?;
                    messages_from_json(&v)
                })
                .collect())
        }
    }
}

fn list_item(dt: &DataType) -> arrow::datatypes::FieldRef {
    match dt {
        DataType::List(f) | DataType::LargeList(f) => f.clone(),
        _ => unreachable!("caller matched a list type"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Int64Array};
    use std::sync::Arc;

    fn src(path: &Path) -> SourceConfig {
        SourceConfig {
            path: path.to_path_buf(),
            format: None,
            text_field: "text".into(),
            messages_field: "messages".into(),
            separator: None,
        }
    }

    fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn jsonl_reads_text_chat_and_groups() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        std::fs::write(
            &p,
            "{\"text\": \"hello\", \"task\": 7}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"task\": \"x\"}\n",
        )
        .unwrap();
        let d = read_source(&src(&p), &p, Some("task")).unwrap();
        assert_eq!(d.records.len(), 2);
        assert_eq!(d.records[0].content, Content::Text("hello".into()));
        assert_eq!(d.records[0].group.as_deref(), Some("7"));
        assert!(d.records[1].at.ends_with("a.jsonl:3"));
        assert_eq!(
            d.records[1].content,
            Content::Chat(vec![Message {
                role: Role::User,
                content: "hi".into()
            }])
        );
    }

    #[test]
    fn malformed_jsonl_line_names_its_line_number() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.jsonl");
        std::fs::write(
            &p,
            "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": oops}\n",
        )
        .unwrap();
        let err = read_source(&src(&p), &p, None).unwrap_err().to_string();
        assert!(err.contains("bad.jsonl:3: malformed JSON"), "{err}");
    }

    #[test]
    fn unknown_chat_role_is_refused_with_its_location() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("chat.jsonl");
        std::fs::write(
            &p,
            "{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}]}\n",
        )
        .unwrap();
        let err = read_source(&src(&p), &p, None).unwrap_err().to_string();
        assert!(
            err.contains("chat.jsonl:1: message 1: unknown chat role \"narrator\""),
            "{err}"
        );
    }

    #[test]
    fn parquet_reads_text_and_groups_and_refuses_a_missing_text_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        write_parquet(
            &p,
            vec![
                (
                    "text",
                    Arc::new(StringArray::from(vec!["a b", "c"])) as ArrayRef,
                ),
                ("trial", Arc::new(Int64Array::from(vec![3, 4])) as ArrayRef),
            ],
        );
        let d = read_source(&src(&p), &p, Some("trial")).unwrap();
        assert_eq!(d.records[1].content, Content::Text("c".into()));
        assert_eq!(d.records[1].group.as_deref(), Some("4"));
        assert!(d.records[1].at.ends_with("t.parquet (row 2)"));

        let q = dir.path().join("body.parquet");
        write_parquet(
            &q,
            vec![("body", Arc::new(StringArray::from(vec!["x"])) as ArrayRef)],
        );
        let err = read_source(&src(&q), &q, None).unwrap_err().to_string();
        assert!(err.contains("no text column \"text\""), "{err}");
        assert!(err.contains("columns are: body"), "{err}");
    }

    #[test]
    fn parquet_chat_as_json_text_column() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.parquet");
        let m = r#"[{"role":"system","content":"s"},{"role":"assistant","content":"a"}]"#;
        write_parquet(
            &p,
            vec![("messages", Arc::new(StringArray::from(vec![m])) as ArrayRef)],
        );
        let d = read_source(&src(&p), &p, None).unwrap();
        let Content::Chat(msgs) = &d.records[0].content else {
            panic!("not chat")
        };
        assert_eq!(msgs[1].role, Role::Assistant);
    }

    #[test]
    fn text_splits_on_separator_and_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "one\n\n\ntwo\n\n").unwrap();
        let mut cfg = src(&p);
        cfg.separator = Some("\n\n".into());
        let d = read_source(&cfg, &p, None).unwrap();
        assert_eq!(d.records.len(), 2);
        let missing = dir.path().join("nope.txt");
        let err = read_source(&src(&missing), &missing, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot read") && err.contains("nope.txt"),
            "{err}"
        );
    }
}
