//! Reading sources (files, directories, globs of JSONL, JSON arrays,
//! Parquet, plain text; [`files`] lists them and tells their formats) into
//! records: plain text or chat messages ([`chat`]), each with its location
//! and optional group key.

use super::chat::{self, Chat, Message, Role};
use super::error::CorpusError;
use super::files::{self, Budget, Compression, Listing, SourceFile};
use super::json_array;
use arrow::array::{Array, AsArray, RecordBatch, StringArray};
use arrow::datatypes::DataType;
use config::{SourceConfig, SourceFormat};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{BufRead, Read};
use std::path::Path;

/// What a record holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// Plain text, tokenized as is.
    Text(String),
    /// A conversation, rendered with the model's chat template.
    Chat(Chat),
}

pub use super::media::{ImageRef, MEDIA_MARKER};

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
    /// Its images, in the order of the [`MEDIA_MARKER`]s in its content.
    pub images: Vec<ImageRef>,
}

/// The most bytes one document may hold (its text, or the sum of its chat
/// messages' contents): 8 MiB. Tokenizing a document costs tens of times
/// its size in memory (a 60 MB single-line document took 3.7 GB), so a
/// larger one is refused, named by file and line, instead of risking the
/// machine; split such documents before calibrating on them.
pub const MAX_DOCUMENT_BYTES: usize = 8 << 20;

/// The most bytes one JSONL line may hold: 32 MiB, four times a
/// document's limit (JSON escapes take room: Python's `json.dumps` writes a
/// CJK character's 3 bytes as 6, an emoji's 4 as 12). Checked before the
/// line is parsed, so a huge line costs no parse (a 1 GB line took 3.1 GB
/// when it was parsed first).
pub const MAX_LINE_BYTES: usize = 4 * MAX_DOCUMENT_BYTES;

impl Content {
    /// Bytes of text the document holds.
    pub fn text_bytes(&self) -> usize {
        match self {
            Content::Text(t) => t.len(),
            Content::Chat(c) => c.text_bytes(),
        }
    }
}

/// A source read: its files' records and what was skipped.
#[derive(Clone, Debug)]
pub struct SourceData {
    /// SHA-256 of the file's bytes; of a directory or glob source, of its
    /// files' paths and hashes ([`combined_sha256`]).
    pub sha256: String,
    /// Size in bytes (of every file read).
    pub bytes: u64,
    /// Its records, in file order.
    pub records: Vec<Record>,
    /// Files read (1 for a file source).
    pub files: u64,
    /// Files of a directory or glob skipped as binary (a NUL byte or
    /// invalid UTF-8 in a text source).
    pub skipped_binary: u64,
    /// Files of a directory or glob skipped for their size.
    pub skipped_large: u64,
    /// Records skipped for having no text: their text (or messages) null,
    /// empty or absent.
    pub skipped_no_text: u64,
}

/// The UTF-8 byte-order mark, which Windows tools write at the start of a
/// text file: skipped there, refused (naming the line) anywhere else.
pub const BOM: &str = "\u{feff}";

/// The error for a byte-order mark past the start of a file.
fn stray_bom() -> String {
    "a UTF-8 byte-order mark (U+FEFF) where only the start of the file may have one \
     (files joined together keep each one's mark: remove it)"
        .into()
}

/// `reader` without a byte-order mark at its start.
fn skip_bom(mut reader: Box<dyn Read>) -> std::io::Result<Box<dyn Read>> {
    let mut head = [0u8; 3];
    let mut n = 0;
    while n < 3 {
        match reader.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    let keep = match &head[..n] == BOM.as_bytes() {
        true => Vec::new(),
        false => head[..n].to_vec(),
    };
    Ok(Box::new(std::io::Cursor::new(keep).chain(reader)))
}

/// Hashes a source without parsing it (for the inputs fingerprint): the
/// file's SHA-256, or a directory's or glob's [`combined_sha256`].
pub fn hash_source(cfg: &SourceConfig, path: &Path) -> Result<String, CorpusError> {
    let listing = list(cfg, path)?;
    let hashes = listing
        .files
        .iter()
        .map(|f| Ok((f, hash_file(&f.path)?)))
        .collect::<Result<Vec<_>, CorpusError>>()?;
    Ok(combined_sha256(&listing, &hashes))
}

/// The SHA-256 of a source: its one file's, or, for a directory or glob,
/// that of a line `PATH\tSHA256` per file (so adding, removing or renaming
/// a file changes it).
fn combined_sha256(listing: &Listing, hashes: &[(&SourceFile, String)]) -> String {
    match (listing.many, hashes) {
        (false, [(_, sha)]) => sha.clone(),
        _ => {
            let mut h = Sha256::new();
            for (f, sha) in hashes {
                h.update(format!("{}\t{sha}\n", f.shown.display()).as_bytes());
            }
            hex::encode(h.finalize())
        }
    }
}

fn hash_file(path: &Path) -> Result<String, CorpusError> {
    gguf::hash::sha256_file(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn list(cfg: &SourceConfig, path: &Path) -> Result<Listing, CorpusError> {
    files::list(cfg, path).map_err(|message| CorpusError::Source {
        path: path.to_path_buf(),
        message,
    })
}

/// Reads a source at `path` (already resolved) as `cfg` describes: its
/// file, or every file of its directory or glob, streamed. Records are
/// located by the config's own spelling of their file; errors name the
/// resolved file, which a user can open from where they ran the command.
pub fn read_source(
    cfg: &SourceConfig,
    path: &Path,
    group_key: Option<&str>,
) -> Result<SourceData, CorpusError> {
    let listing = list(cfg, path)?;
    let mut hashes = Vec::new();
    let mut data = SourceData {
        sha256: String::new(),
        bytes: 0,
        records: Vec::new(),
        files: 0,
        skipped_binary: 0,
        skipped_large: listing.skipped_large,
        skipped_no_text: 0,
    };
    for f in &listing.files {
        let (format, compression) =
            files::detect(cfg, &f.path).map_err(|message| CorpusError::Source {
                path: f.path.clone(),
                message,
            })?;
        let sha = hash_file(&f.path)?;
        data.bytes += std::fs::metadata(&f.path)
            .map_err(|source| CorpusError::Io {
                path: f.path.clone(),
                source,
            })?
            .len();
        let opened = Opened {
            file: f,
            compression,
            budget: Budget::of(cfg, listing.many),
        };
        let records = match format {
            SourceFormat::Jsonl | SourceFormat::Json => {
                let mut json = JsonRecords {
                    cfg,
                    group_key,
                    records: Vec::new(),
                    no_text: &mut data.skipped_no_text,
                };
                match format {
                    SourceFormat::Jsonl => read_jsonl(&opened, &mut json)?,
                    _ => read_json_array(&opened, &mut json)?,
                }
                json.records
            }
            SourceFormat::Parquet => read_parquet(cfg, f, group_key, &mut data.skipped_no_text)?,
            SourceFormat::Text => match read_text(cfg, &opened, listing.many)? {
                Some(r) => r,
                None => {
                    data.skipped_binary += 1;
                    hashes.push((f, sha));
                    continue;
                }
            },
        };
        data.files += 1;
        data.records.extend(records);
        hashes.push((f, sha));
    }
    data.sha256 = combined_sha256(&listing, &hashes);
    if data.records.is_empty() && data.skipped_no_text > 0 {
        return Err(CorpusError::Source {
            path: path.to_path_buf(),
            message: format!(
                "no record has text: all {} records have a null, empty or absent {:?} \
                 (or {:?}) field",
                data.skipped_no_text, cfg.text_field, cfg.messages_field
            ),
        });
    }
    if let Some(r) = data
        .records
        .iter()
        .find(|r| r.content.text_bytes() > MAX_DOCUMENT_BYTES)
    {
        return Err(CorpusError::Record {
            at: r.at.clone(),
            message: format!(
                "document of {} bytes exceeds the per-document limit of {MAX_DOCUMENT_BYTES} bytes \
                 (split it into smaller documents)",
                r.content.text_bytes()
            ),
        });
    }
    Ok(data)
}

/// A file of a source with how it is to be read.
struct Opened<'a> {
    file: &'a SourceFile,
    compression: Compression,
    /// What it may decompress to (when compressed).
    budget: Budget,
}

impl Opened<'_> {
    /// The file, decompressed within its budget, named when it fails.
    fn open(&self) -> Result<Box<dyn Read>, CorpusError> {
        files::open(&self.file.path, self.compression, self.budget).map_err(|e| self.io(e))
    }

    fn io(&self, source: std::io::Error) -> CorpusError {
        CorpusError::Io {
            path: self.file.path.clone(),
            source,
        }
    }
}

/// A text file's documents (split on the source's `separator`), streamed:
/// a document is refused (named by file and number) as soon as it grows
/// past [`MAX_DOCUMENT_BYTES`], before more of it is read. `None` for a
/// binary file of a directory or glob (skipped), which a file named alone
/// is refused for.
fn read_text(
    cfg: &SourceConfig,
    opened: &Opened,
    many: bool,
) -> Result<Option<Vec<Record>>, CorpusError> {
    let f = opened.file;
    let mut reader = skip_bom(opened.open()?).map_err(|e| opened.io(e))?;
    let sep = cfg.separator.as_deref().filter(|s| !s.is_empty());
    let mut pieces = TextPieces {
        shown: f.shown.display().to_string(),
        n: 0,
        line: 1,
        sep_lines: sep.map_or(0, |s| s.matches('\n').count()),
        records: Vec::new(),
    };
    let mut pending: Vec<u8> = Vec::new();
    // Where the search for the next separator resumes in `pending`.
    let mut scanned = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = reader.read(&mut buf).map_err(|e| opened.io(e))?;
        if n == 0 {
            break;
        }
        if many && buf[..n].contains(&0) {
            return Ok(None);
        }
        pending.extend_from_slice(&buf[..n]);
        if let Some(sep) = sep.map(str::as_bytes) {
            let mut start = 0;
            while let Some(at) = find(&pending[scanned..], sep) {
                let end = scanned + at;
                if !pieces.push(&pending[start..end], many, &f.path)? {
                    return Ok(None);
                }
                start = end + sep.len();
                scanned = start;
            }
            pending.drain(..start);
            scanned = pending.len().saturating_sub(sep.len() - 1);
        }
        let held = pending.len() - sep.map_or(0, |s| s.len() - 1).min(pending.len());
        if held > MAX_DOCUMENT_BYTES {
            return Err(CorpusError::Record {
                at: format!("{} (document {})", f.shown.display(), pieces.n + 1),
                message: format!(
                    "document of more than {MAX_DOCUMENT_BYTES} bytes exceeds the per-document \
                     limit of {MAX_DOCUMENT_BYTES} bytes (split it into smaller documents)"
                ),
            });
        }
    }
    if !pieces.push(&pending, many, &f.path)? {
        return Ok(None);
    }
    Ok(Some(pieces.records))
}

/// The documents of a text file as they are split off.
struct TextPieces {
    shown: String,
    /// Documents kept so far.
    n: usize,
    /// The line the next piece starts on.
    line: usize,
    /// Lines a separator spans.
    sep_lines: usize,
    records: Vec<Record>,
}

impl TextPieces {
    /// Keeps `piece` (trimmed) as the next document unless it is blank;
    /// false when it is not UTF-8 in a directory or glob source (the file
    /// is binary and skipped), an error when it is not in a file named alone.
    fn push(&mut self, piece: &[u8], many: bool, path: &Path) -> Result<bool, CorpusError> {
        let text = match std::str::from_utf8(piece) {
            Ok(t) => t,
            Err(_) if many => return Ok(false),
            Err(e) => {
                return Err(CorpusError::Source {
                    path: path.to_path_buf(),
                    message: format!("not UTF-8 text ({e})"),
                })
            }
        };
        if let Some(at) = text.find(BOM) {
            return Err(CorpusError::Record {
                at: format!(
                    "{} (line {})",
                    self.shown,
                    self.line + text[..at].matches('\n').count()
                ),
                message: stray_bom(),
            });
        }
        self.line += text.matches('\n').count() + self.sep_lines;
        let text = text.trim();
        if !text.is_empty() {
            self.n += 1;
            self.records.push(Record {
                at: format!("{} (document {})", self.shown, self.n),
                content: Content::Text(text.to_string()),
                group: None,
                images: Vec::new(),
            });
        }
        Ok(true)
    }
}

/// Where `needle` first occurs in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The records of a JSON file (lines or an array) as they are read.
struct JsonRecords<'a> {
    cfg: &'a SourceConfig,
    group_key: Option<&'a str>,
    records: Vec<Record>,
    /// Records skipped for having no text, counted for the whole source.
    no_text: &'a mut u64,
}

impl JsonRecords<'_> {
    /// Keeps the record `value` of `file`, located at `at`, or counts it
    /// when it has no text ([`json_record`]).
    fn push(&mut self, file: &Path, value: &Value, at: String) -> Result<(), String> {
        match json_record(self.cfg, file, value, at, self.group_key)? {
            Some(r) => self.records.push(r),
            None => *self.no_text += 1,
        }
        Ok(())
    }
}

/// JSON lines, streamed line by line.
fn read_jsonl(opened: &Opened, out: &mut JsonRecords) -> Result<(), CorpusError> {
    let f = opened.file;
    let mut reader = std::io::BufReader::new(opened.open()?);
    let mut line = Vec::new();
    for i in 0.. {
        line.clear();
        // At most one byte past the limit (and its newline) is read, so a
        // huge line is refused without being held.
        let n = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 2)
            .read_until(b'\n', &mut line)
            .map_err(|source| CorpusError::Io {
                path: f.path.clone(),
                source,
            })?;
        if n == 0 {
            break;
        }
        let bad = |message: String| CorpusError::Record {
            at: format!("{}:{}", f.path.display(), i + 1),
            message,
        };
        if line.strip_suffix(b"\n").unwrap_or(&line).len() > MAX_LINE_BYTES {
            return Err(bad(format!(
                "line of more than {MAX_LINE_BYTES} bytes exceeds the per-line limit \
                 (split the document into smaller ones)"
            )));
        }
        let text = std::str::from_utf8(&line).map_err(|e| bad(format!("not UTF-8 text ({e})")))?;
        let text = match (i, text.strip_prefix(BOM)) {
            (0, Some(rest)) => rest,
            (_, Some(_)) => return Err(bad(stray_bom())),
            (_, None) => text,
        };
        if text.trim().is_empty() {
            continue;
        }
        let value: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("malformed JSON: {e}")))?;
        let at = format!("{}:{}", f.shown.display(), i + 1);
        out.push(&f.path, &value, at).map_err(bad)?;
    }
    Ok(())
}

/// A JSON array of records, streamed element by element, each at most
/// [`MAX_LINE_BYTES`] of JSON (a JSON lines record's limit), refused before
/// more of it is read.
fn read_json_array(opened: &Opened, out: &mut JsonRecords) -> Result<(), CorpusError> {
    let f = opened.file;
    let mut failed_at = None;
    let reader = std::io::BufReader::new(skip_bom(opened.open()?).map_err(|e| opened.io(e))?);
    let read = json_array::for_each(reader, MAX_LINE_BYTES as u64, &mut |i, value| {
        let at = format!("{} (record {})", f.shown.display(), i + 1);
        failed_at = Some(i + 1);
        out.push(&f.path, &value, at)?;
        failed_at = None;
        Ok(())
    });
    read.map_err(|message| match failed_at {
        Some(n) => CorpusError::Record {
            at: format!("{} (record {n})", f.path.display()),
            message,
        },
        None => CorpusError::Source {
            path: f.path.clone(),
            message,
        },
    })
}

/// The text field a record or table has: `text_field`, or with the
/// default (`text`) `content` when it lacks `text`.
fn text_field_of(cfg: &SourceConfig, has: impl Fn(&str) -> bool) -> Option<&str> {
    if has(&cfg.text_field) {
        Some(&cfg.text_field)
    } else if cfg.text_field == "text" && has("content") {
        Some("content")
    } else {
        None
    }
}

/// The messages field a record or table has: `messages_field`, or with
/// the default (`messages`) ShareGPT's `conversations`.
fn messages_field_of(cfg: &SourceConfig, has: impl Fn(&str) -> bool) -> Option<&str> {
    if has(&cfg.messages_field) {
        Some(&cfg.messages_field)
    } else if cfg.messages_field == "messages" && has("conversations") {
        Some("conversations")
    } else {
        None
    }
}

/// The field holding a chat record's tool definitions: `tools_field`,
/// default `tools`.
fn tools_field(cfg: &SourceConfig) -> &str {
    cfg.tools_field.as_deref().unwrap_or("tools")
}

/// The chat field mapping of `cfg`.
fn chat_fields(cfg: &SourceConfig) -> chat::Fields<'_> {
    chat::Fields {
        role: cfg.role_field.as_deref(),
        content: cfg.content_field.as_deref(),
    }
}

/// One JSON record (a JSONL line, an element of a JSON array) of the file
/// `file`, located at `at`: text (captioned images) or chat; `None` for a
/// record without text (its text, or its messages, null, empty or absent),
/// which the source skips and counts.
fn json_record(
    cfg: &SourceConfig,
    file: &Path,
    value: &Value,
    at: String,
    group_key: Option<&str>,
) -> Result<Option<Record>, String> {
    let obj = value.as_object().ok_or("record is not a JSON object")?;
    // A null field is an absent one.
    let has = |k: &str| obj.get(k).is_some_and(|v| !v.is_null());
    let mut names = Vec::new();
    let content = if let Some(field) = text_field_of(cfg, has) {
        let t = obj[field]
            .as_str()
            .ok_or_else(|| format!("field {field:?} is not a string"))?;
        match obj.get(IMAGE_FIELD) {
            Some(v) => {
                names = image_names(v)?;
                Content::Text(captioned(names.len(), t))
            }
            None if t.is_empty() => return Ok(None),
            None => Content::Text(t.to_string()),
        }
    } else if let Some(field) = messages_field_of(cfg, has) {
        if obj[field].as_array().is_some_and(Vec::is_empty) {
            return Ok(None);
        }
        let messages = chat::messages_from_json(&obj[field], chat_fields(cfg), &mut |parts| {
            content_parts(parts, &mut names)
        })?;
        let tools = match obj.get(tools_field(cfg)) {
            Some(t) => chat::tools_from_json(t)?,
            None => None,
        };
        Content::Chat(Chat { messages, tools })
    } else {
        return Ok(None);
    };
    if !names.is_empty() {
        check_markers(&content, names.len())?;
    }
    let images = names
        .iter()
        .map(|n| {
            let dir = super::image_file::image_dir(cfg.image_dir.as_deref(), file);
            super::image_file::image_ref(dir, n)
        })
        .collect::<Result<_, _>>()?;
    let group = group_key.and_then(|k| obj.get(k)).and_then(|g| match g {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    });
    Ok(Some(Record {
        at,
        content,
        group,
        images,
    }))
}

/// JSONL field naming a record's image (a path, or an array of paths) in
/// `{"image": PATH, "text": CAPTION}` records.
pub const IMAGE_FIELD: &str = "image";

/// The image paths of an `image` field: a string or an array of strings.
fn image_names(v: &Value) -> Result<Vec<String>, String> {
    let bad = || format!("field {IMAGE_FIELD:?} is not a path or an array of paths");
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(bad))
            .collect(),
        _ => Err(bad()),
    }
}

/// A captioned record's text: one marker per image, then the caption.
fn captioned(n_images: usize, caption: &str) -> String {
    format!("{}\n{caption}", MEDIA_MARKER.repeat(n_images))
}

/// Refuses a record whose text holds more media markers than it has images
/// (a marker written literally would stand for an image).
fn check_markers(content: &Content, n_images: usize) -> Result<(), String> {
    let markers = match content {
        Content::Text(t) => t.matches(MEDIA_MARKER).count(),
        Content::Chat(c) => c
            .messages
            .iter()
            .map(|m| m.content.matches(MEDIA_MARKER).count())
            .sum(),
    };
    if markers != n_images {
        return Err(format!(
            "text holds the media marker {MEDIA_MARKER:?} literally, which would stand for an image"
        ));
    }
    Ok(())
}

/// The text of a message's content parts, images as markers.
fn content_parts(parts: &[Value], images: &mut Vec<String>) -> Result<String, String> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        let bad = |e: &str| format!("content part {}: {e}", j + 1);
        let field = |k: &str| p.get(k).and_then(Value::as_str);
        match field("type") {
            Some("text") => {
                let t = field("text").ok_or_else(|| bad("a text part needs a string \"text\""))?;
                text.push_str(t);
            }
            Some("image") => {
                let name = field("image")
                    .ok_or_else(|| bad("an image part needs a string \"image\" path"))?;
                images.push(name.to_string());
                text.push_str(MEDIA_MARKER);
            }
            _ => return Err(bad("\"type\" is neither \"text\" nor \"image\"")),
        }
    }
    Ok(text)
}

/// A Parquet table (any codec the workspace builds: zstd, lz4, brotli,
/// snappy, gzip), read batch by batch from the file.
fn read_parquet(
    cfg: &SourceConfig,
    f: &SourceFile,
    group_key: Option<&str>,
    no_text: &mut u64,
) -> Result<Vec<Record>, CorpusError> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let path = f.path.as_path();
    let fail = |message: String| CorpusError::Source {
        path: path.to_path_buf(),
        message,
    };
    let file = std::fs::File::open(path).map_err(|source| CorpusError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| fail(format!("not a readable Parquet file ({e})")))?;
    let schema = builder.schema().clone();
    let has = |name: &str| schema.column_with_name(name).is_some();
    let text_field = text_field_of(cfg, has);
    let messages_field = messages_field_of(cfg, has);
    if text_field.is_none() && messages_field.is_none() {
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
        let at = |row: usize| row_of(&f.shown, row);
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
        if let Some(text_field) = text_field {
            let text = string_column(&batch, text_field).map_err(&fail)?;
            for row in 0..batch.num_rows() {
                if text.is_null(row) || text.value(row).is_empty() {
                    *no_text += 1;
                    continue;
                }
                out.push(Record {
                    at: at(row),
                    content: Content::Text(text.value(row).to_string()),
                    group: group(row),
                    images: Vec::new(),
                });
            }
        } else if let Some(messages_field) = messages_field {
            let messages =
                messages_column(&batch, messages_field, chat_fields(cfg)).map_err(&fail)?;
            let tools = match has(tools_field(cfg)) {
                true => Some(string_column(&batch, tools_field(cfg)).map_err(&fail)?),
                false => None,
            };
            for (row, m) in messages.into_iter().enumerate() {
                let record_error = |message| CorpusError::Record {
                    at: shown(row),
                    message,
                };
                let Some(messages) = m.map_err(record_error)? else {
                    *no_text += 1;
                    continue;
                };
                let tools = match tools.as_ref().filter(|t| t.is_valid(row)) {
                    Some(t) => chat::tools_from_json(&Value::String(t.value(row).into()))
                        .map_err(record_error)?,
                    None => None,
                };
                out.push(Record {
                    at: at(row),
                    content: Content::Chat(Chat { messages, tools }),
                    group: group(row),
                    images: Vec::new(),
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

/// One row's messages: `None` when they are null or empty; an error
/// naming what is wrong with them.
type RowMessages = Result<Option<Vec<Message>>, String>;

/// A messages column: JSON text, or a list of structs with `role` and
/// `content`; `None` for a row whose messages are null or empty.
fn messages_column(
    batch: &RecordBatch,
    name: &str,
    fields: chat::Fields<'_>,
) -> Result<Vec<RowMessages>, String> {
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
                    if list.is_null(row) || list.value_length(row) == 0 {
                        return Ok(None);
                    }
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
                    let pick = |given: Option<&str>, a: &str, b: &str| match given {
                        Some(g) => field(g),
                        None if items.column_by_name(a).is_some() => field(a),
                        None => field(b),
                    };
                    let roles = pick(fields.role, "role", "from")?;
                    let contents = pick(fields.content, "content", "value")?;
                    (0..items.len())
                        .map(|i| {
                            Ok(Message::text(
                                Role::parse(roles.value(i))
                                    .map_err(|e| format!("message {}: {e}", i + 1))?,
                                contents.value(i),
                            ))
                        })
                        .collect::<Result<_, String>>()
                        .map(Some)
                })
                .collect())
        }
        _ => {
            let text = string_column(batch, name)?;
            Ok(rows
                .map(|row| {
                    if text.is_null(row) || text.value(row).is_empty() {
                        return Ok(None);
                    }
                    let v: Value = serde_json::from_str(text.value(row))
                        .map_err(|e| format!("column {name:?} is not JSON messages ({e})"))?;
                    let mut images = Vec::new();
                    let m = chat::messages_from_json(&v, fields, &mut |parts| {
                        content_parts(parts, &mut images)
                    })?;
                    match images.is_empty() {
                        true => Ok(Some(m).filter(|m| !m.is_empty())),
                        false => Err(format!(
                            "column {name:?}: image parts are read from JSONL sources only"
                        )),
                    }
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
            ..SourceConfig::default()
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
            Content::Chat(Chat::new(vec![Message::text(Role::User, "hi")]))
        );
    }

    #[test]
    fn an_oversized_document_is_refused_naming_file_and_line() {
        let at_limit = "a".repeat(MAX_DOCUMENT_BYTES);
        let over = "b".repeat(MAX_DOCUMENT_BYTES + 1);
        let text = format!("{{\"text\": \"{at_limit}\"}}\n{{\"text\": \"{over}\"}}\n");
        let err = read_error("big.jsonl", &text);
        assert!(
            err.contains(&format!(
                "big.jsonl:2: document of {} bytes exceeds the per-document limit of {} bytes",
                MAX_DOCUMENT_BYTES + 1,
                MAX_DOCUMENT_BYTES
            )),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("big.txt");
        std::fs::write(&t, format!("short\n\n{over}")).unwrap();
        let mut cfg = src(&t);
        cfg.separator = Some("\n\n".into());
        let err = read_source(&cfg, &t, None).unwrap_err().to_string();
        assert!(err.contains("big.txt (document 2): document of"), "{err}");
    }

    fn write_png(path: &Path, w: u32, h: u32) {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().unwrap();
        writer
            .write_image_data(&vec![90; (w * h * 3) as usize])
            .unwrap();
        writer.finish().unwrap();
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn image_records_resolve_their_images_beside_the_source() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("pics")).unwrap();
        write_png(&dir.path().join("pics/a.png"), 4, 3);
        std::fs::write(
            dir.path().join("pics/b.jpg"),
            [0xff, 0xd8, 0xff, 0xe0, 0, 16],
        )
        .unwrap();
        let p = dir.path().join("img.jsonl");
        let chat = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image", "image": "pics/a.png"}, {"type": "image", "image": "pics/b.jpg"}]}, {"role": "assistant", "content": "Same."}]}"#;
        std::fs::write(
            &p,
            format!("{{\"image\": \"pics/a.png\", \"text\": \"grey\"}}\n{chat}\n{{\"text\": \"plain\"}}\n"),
        )
        .unwrap();
        let d = read_source(&src(&p), &p, None).unwrap();
        let r = &d.records;
        assert_eq!(r[0].content, Content::Text(format!("{MEDIA_MARKER}\ngrey")));
        assert_eq!(r[0].images.len(), 1);
        assert_eq!(r[0].images[0].path, dir.path().join("pics/a.png"));
        let Content::Chat(Chat { messages: m, .. }) = &r[1].content else {
            panic!("not chat")
        };
        assert_eq!(
            m[0].content,
            format!("Compare {MEDIA_MARKER}{MEDIA_MARKER}")
        );
        let names: Vec<&str> = r[1].images.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["pics/a.png", "pics/b.jpg"]);
        assert_eq!(r[1].images[0].sha256, r[0].images[0].sha256);
        assert!(r[2].images.is_empty());
    }

    #[test]
    fn a_missing_or_unreadable_image_is_named_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("img.jsonl");
        let check = |records: &str, expect: &[&str]| {
            std::fs::write(&p, records).unwrap();
            let err = read_source(&src(&p), &p, None).unwrap_err().to_string();
            for e in expect {
                assert!(err.contains(e), "{err} lacks {e}");
            }
        };
        let ok = "{\"text\": \"fine\"}\n";
        check(
            &format!("{ok}{{\"image\": \"gone.png\", \"text\": \"x\"}}\n"),
            &["img.jsonl:2: image \"gone.png\": cannot read", "gone.png"],
        );
        std::fs::write(dir.path().join("cut.png"), b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR").unwrap();
        check(
            &format!("{ok}{ok}{{\"image\": [\"cut.png\"], \"text\": \"x\"}}\n"),
            &["img.jsonl:3: image \"cut.png\"", "not a readable PNG"],
        );
        std::fs::write(dir.path().join("notes.png"), b"hello").unwrap();
        let part = r#"{"messages": [{"role": "user", "content": [{"type": "image", "image": "notes.png"}]}]}"#;
        check(
            &format!("{part}\n"),
            &[
                "img.jsonl:1: image \"notes.png\"",
                "not a PNG or JPEG image",
            ],
        );
        write_png(&dir.path().join("ok.png"), 2, 2);
        check(
            "{\"image\": \"ok.png\", \"text\": \"a <__media__> b\"}\n",
            &["img.jsonl:1:", "holds the media marker"],
        );
        check(
            r#"{"messages": [{"role": "system", "content": "see <__media__>"}, {"role": "user", "content": [{"type": "image", "image": "ok.png"}]}]}"#,
            &["img.jsonl:1:", "holds the media marker"],
        );
        check(
            r#"{"messages": [{"role": "user", "content": [{"type": "video", "video": "ok.png"}]}]}"#,
            &[
                "img.jsonl:1: message 1: content part 1:",
                "neither \"text\" nor \"image\"",
            ],
        );
    }

    /// The error reading `text` as the source file `name` gives.
    fn read_error(name: &str, text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        read_source(&src(&p), &p, None).unwrap_err().to_string()
    }

    #[test]
    fn malformed_jsonl_line_names_its_line_number() {
        let text = "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": oops}\n";
        let err = read_error("bad.jsonl", text);
        assert!(err.contains("bad.jsonl:3: malformed JSON"), "{err}");
    }

    #[test]
    fn unknown_chat_role_is_refused_with_its_location() {
        let text = "{\"messages\": [{\"role\": \"narrator\", \"content\": \"x\"}]}\n";
        let err = read_error("chat.jsonl", text);
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
        let Content::Chat(Chat { messages: msgs, .. }) = &d.records[0].content else {
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

    /// Reads `text` as file `name` (with `separator` for text).
    fn read_as(name: &str, text: &str, separator: Option<&str>) -> Result<SourceData, String> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        let mut cfg = src(&p);
        cfg.separator = separator.map(str::to_string);
        read_source(&cfg, &p, None).map_err(|e| e.to_string())
    }

    fn texts(d: &SourceData) -> Vec<String> {
        d.records
            .iter()
            .map(|r| match &r.content {
                Content::Text(t) => t.clone(),
                Content::Chat(c) => format!("{} messages", c.messages.len()),
            })
            .collect()
    }

    /// The texts kept and the count of records skipped for having none.
    fn texts_and_skipped(d: &SourceData) -> (Vec<String>, u64) {
        (texts(d), d.skipped_no_text)
    }

    #[test]
    fn a_byte_order_mark_is_skipped_at_the_start_and_refused_elsewhere() {
        let jsonl = "\u{feff}{\"text\": \"a\"}\r\n{\"text\": \"b\"}\r\n";
        assert_eq!(texts(&read_as("a.jsonl", jsonl, None).unwrap()), ["a", "b"]);
        let json = "\u{feff}[{\"text\": \"a\"}, {\"text\": \"b\"}]";
        assert_eq!(texts(&read_as("a.json", json, None).unwrap()), ["a", "b"]);
        let text = "\u{feff}one\n\ntwo";
        let d = read_as("a.txt", text, Some("\n\n")).unwrap();
        assert_eq!(texts(&d), ["one", "two"]);
        // A mark inside a JSON string is text, not a mark.
        let inside = "{\"text\": \"x\u{feff}y\"}\n";
        assert_eq!(
            texts(&read_as("i.jsonl", inside, None).unwrap()),
            ["x\u{feff}y"]
        );

        let joined = "{\"text\": \"a\"}\n\u{feff}{\"text\": \"b\"}\n";
        let e = read_as("j.jsonl", joined, None).unwrap_err();
        assert!(
            e.contains("j.jsonl:2: a UTF-8 byte-order mark (U+FEFF)"),
            "{e}"
        );
        let joined = "one\n\ntwo\n\u{feff}three\n\nfour";
        let e = read_as("j.txt", joined, Some("\n\n")).unwrap_err();
        assert!(e.contains("j.txt (line 4): a UTF-8 byte-order mark"), "{e}");
        let e = read_as("k.txt", "a\nb\u{feff}", None).unwrap_err();
        assert!(e.contains("k.txt (line 2): a UTF-8 byte-order mark"), "{e}");
    }

    #[test]
    fn records_without_text_are_skipped_and_counted_and_a_source_of_none_refused() {
        let jsonl = [
            "{\"text\": \"kept\"}",
            "{\"text\": null}",
            "{\"text\": \"\"}",
            "{\"title\": \"no text\"}",
            "{\"messages\": []}",
            "{\"messages\": null}",
            "{\"text\": null, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
        ]
        .join("\n");
        let d = read_as("m.jsonl", &jsonl, None).unwrap();
        assert_eq!(texts(&d), ["kept", "1 messages"]);
        assert_eq!(d.skipped_no_text, 5);
        assert!(d.records[1].at.ends_with("m.jsonl:7"));
        let array = "[{\"text\": null}, {\"text\": \"kept\"}, {}]";
        let d = read_as("m.json", array, None).unwrap();
        assert_eq!(texts_and_skipped(&d), (vec!["kept".to_string()], 2));
        // A field of another type is still an error, naming the record.
        let e = read_as("n.jsonl", "{\"text\": 7}\n", None).unwrap_err();
        assert!(
            e.contains("n.jsonl:1: field \"text\" is not a string"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.parquet");
        let text = StringArray::from(vec![Some("a"), None, Some(""), Some("b")]);
        write_parquet(&p, vec![("text", Arc::new(text) as ArrayRef)]);
        let d = read_source(&src(&p), &p, None).unwrap();
        assert_eq!(texts_and_skipped(&d), (vec!["a".into(), "b".into()], 2));
        assert!(d.records[1].at.ends_with("t.parquet (row 4)"));
        let m = dir.path().join("m.parquet");
        let messages = StringArray::from(vec![
            None,
            Some("[]"),
            Some(r#"[{"role":"user","content":"hi"}]"#),
        ]);
        write_parquet(&m, vec![("messages", Arc::new(messages) as ArrayRef)]);
        let d = read_source(&src(&m), &m, None).unwrap();
        assert_eq!(texts_and_skipped(&d), (vec!["1 messages".into()], 2));

        let e = read_as("none.jsonl", "{\"text\": null}\n{\"body\": \"x\"}\n", None).unwrap_err();
        assert!(
            e.contains("none.jsonl: no record has text: all 2 records have a null, empty or absent \"text\""),
            "{e}"
        );
    }
}
