//! The files of a source: one file, every file under a directory, or the
//! files a glob matches, filtered by `include` / `exclude` and a size limit;
//! and each file's format and compression, told from its name (or the
//! config's `format`) and never guessed.

use config::{SourceConfig, SourceFormat, DEFAULT_MAX_FILE_BYTES};
use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use std::io::Read;
use std::path::{Path, PathBuf};

/// One file of a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    /// The file, resolved (errors name it).
    pub path: PathBuf,
    /// The file as the config spells it (relative to the config's
    /// directory): locates its records.
    pub shown: PathBuf,
}

/// A source's files and what its filters skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// The files, in name order.
    pub files: Vec<SourceFile>,
    /// Whether the source names a directory or a glob (not one file).
    pub many: bool,
    /// Files skipped for their size (over `max_file_bytes`).
    pub skipped_large: u64,
}

/// How a file's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Stored as is.
    None,
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`, `.zstd`).
    Zstd,
}

/// Whether a path holds glob syntax.
fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '[', '{'])
}

/// Compiles a glob in which `*` stays within a directory.
fn glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("bad glob {pattern:?} ({e})"))
}

/// `include` or `exclude` patterns: those with a `/` match the path
/// relative to the source's directory, the others the file name.
struct Patterns {
    paths: GlobSet,
    names: GlobSet,
    empty: bool,
}

impl Patterns {
    fn new(key: &str, patterns: &[String]) -> Result<Patterns, String> {
        let (mut paths, mut names) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for p in patterns {
            let g = GlobBuilder::new(p.trim_end_matches('/'))
                .literal_separator(true)
                .build()
                .or_else(|_| Glob::new(p))
                .map_err(|e| format!("{key}: bad glob {p:?} ({e})"))?;
            match p.contains('/') {
                true => paths.add(g),
                false => names.add(g),
            };
        }
        let build = |b: GlobSetBuilder| b.build().map_err(|e| format!("{key}: {e}"));
        Ok(Patterns {
            paths: build(paths)?,
            names: build(names)?,
            empty: patterns.is_empty(),
        })
    }

    fn matches(&self, rel: &Path) -> bool {
        self.paths.is_match(rel) || rel.file_name().is_some_and(|n| self.names.is_match(n))
    }
}

/// The files of source `cfg`, whose path resolves to `path`. A missing
/// file is left for the reader to name; a directory or glob that yields no
/// file is refused.
pub fn list(cfg: &SourceConfig, path: &Path) -> Result<Listing, String> {
    let spelled = cfg.path.to_string_lossy();
    let (base, shown_base, pattern) = if is_glob(&spelled) {
        let fixed: PathBuf = cfg
            .path
            .components()
            .take_while(|c| !is_glob(&c.as_os_str().to_string_lossy()))
            .collect();
        let rest = cfg.path.strip_prefix(&fixed).unwrap_or(&cfg.path);
        let resolved = path
            .ancestors()
            .nth(rest.components().count())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        (resolved, fixed, Some(glob(&rest.to_string_lossy())?))
    } else if path.is_dir() {
        (path.to_path_buf(), cfg.path.clone(), None)
    } else {
        return Ok(Listing {
            files: vec![SourceFile {
                path: path.to_path_buf(),
                shown: cfg.path.clone(),
            }],
            many: false,
            skipped_large: 0,
        });
    };
    let include = Patterns::new("include", &cfg.include)?;
    let exclude = Patterns::new("exclude", &cfg.exclude)?;
    let max = cfg.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES);
    let mut listing = Listing {
        many: true,
        ..Listing::default()
    };
    let mut rels = Vec::new();
    walk(&base, Path::new(""), &exclude, &mut rels)?;
    for (rel, size) in rels {
        let wanted = pattern.as_ref().is_none_or(|g| g.is_match(&rel))
            && (include.empty || include.matches(&rel));
        if !wanted {
            continue;
        }
        if size > max {
            listing.skipped_large += 1;
            continue;
        }
        listing.files.push(SourceFile {
            path: base.join(&rel),
            shown: shown_base.join(&rel),
        });
    }
    if listing.files.is_empty() {
        return Err(format!(
            "matches no file{} (a directory or glob source needs at least one)",
            match listing.skipped_large {
                0 => String::new(),
                n => format!(" under {max} bytes; {n} larger skipped"),
            }
        ));
    }
    Ok(listing)
}

/// Every regular file under `dir` (relative to the walk's root, with its
/// size), in name order; hidden entries, symbolic links and excluded
/// entries are skipped.
fn walk(
    root: &Path,
    rel: &Path,
    exclude: &Patterns,
    out: &mut Vec<(PathBuf, u64)>,
) -> Result<(), String> {
    let dir = root.join(rel);
    let cannot = |e: std::io::Error| format!("cannot list {} ({e})", dir.display());
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(cannot)?
        .collect::<Result<_, _>>()
        .map_err(cannot)?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let child = rel.join(&name);
        if name.to_string_lossy().starts_with('.') || exclude.matches(&child) {
            continue;
        }
        let kind = e.file_type().map_err(cannot)?;
        if kind.is_dir() {
            walk(root, &child, exclude, out)?;
        } else if kind.is_file() {
            out.push((child, e.metadata().map_err(cannot)?.len()));
        }
    }
    Ok(())
}

/// A file's format (`cfg.format`, else told from its name) and
/// compression (from its name); a name that tells no format is refused.
pub fn detect(cfg: &SourceConfig, file: &Path) -> Result<(SourceFormat, Compression), String> {
    let name = file
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let (inner, compression) = if let Some(s) = name.strip_suffix(".gz") {
        (s, Compression::Gzip)
    } else if let Some(s) = name
        .strip_suffix(".zst")
        .or_else(|| name.strip_suffix(".zstd"))
    {
        (s, Compression::Zstd)
    } else {
        (name.as_str(), Compression::None)
    };
    let told = match inner.rsplit_once('.').map(|(_, e)| e) {
        Some("jsonl" | "ndjson") => Some(SourceFormat::Jsonl),
        Some("json") => Some(SourceFormat::Json),
        Some("parquet") => Some(SourceFormat::Parquet),
        Some("txt" | "text" | "md" | "markdown" | "raw") => Some(SourceFormat::Text),
        _ => None,
    };
    let format = cfg.format.or(told).ok_or_else(|| {
        "its name does not tell its format (.jsonl, .json, .parquet, .txt, each .gz or \
             .zst compressed but Parquet): set format = \"text\", \"jsonl\", \"json\" or \
             \"parquet\" in the source"
            .to_string()
    })?;
    if format == SourceFormat::Parquet && compression != Compression::None {
        return Err(
            "a compressed Parquet file is not read: Parquet compresses its own \
                    columns (zstd, lz4, brotli, snappy, gzip); decompress the file"
                .into(),
        );
    }
    Ok((format, compression))
}

/// Bytes a compressed file named alone as a source may decompress to:
/// 1 GiB (a file listed by a directory or glob source has its
/// `max_file_bytes` instead). A larger corpus file can be read
/// decompressed, its size then told by the file system.
pub const MAX_DECOMPRESSED_BYTES: u64 = 1 << 30;

/// How many bytes a compressed file may decompress to, and the rule that
/// says so (named in the refusal).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The most decompressed bytes.
    pub bytes: u64,
    /// Where the limit comes from.
    pub rule: &'static str,
}

impl Budget {
    /// The budget of a compressed file: `max_file_bytes` (its default when
    /// unset) in a directory or glob source (`many`), else
    /// [`MAX_DECOMPRESSED_BYTES`].
    pub fn of(cfg: &SourceConfig, many: bool) -> Budget {
        match many {
            true => Budget {
                bytes: cfg.max_file_bytes.unwrap_or(DEFAULT_MAX_FILE_BYTES),
                rule: "the source's max_file_bytes, which a directory or glob source \
                       applies to each file's decompressed size",
            },
            false => Budget {
                bytes: MAX_DECOMPRESSED_BYTES,
                rule: "the limit for a compressed source file; decompress it to read \
                       more",
            },
        }
    }
}

/// Opens a file for streaming, decompressing it as `compression` says; a
/// compressed file's reader fails once it has given more than `budget`'s
/// bytes, so a small file that decompresses to gigabytes is refused after
/// reading no more than the budget.
pub fn open(
    path: &Path,
    compression: Compression,
    budget: Budget,
) -> std::io::Result<Box<dyn Read>> {
    let file = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open(path)?);
    let limited = |inner: Box<dyn Read>| -> Box<dyn Read> {
        Box::new(Limited {
            inner,
            given: 0,
            budget,
        })
    };
    Ok(match compression {
        Compression::None => Box::new(file),
        Compression::Gzip => limited(Box::new(flate2::read::MultiGzDecoder::new(file))),
        Compression::Zstd => limited(Box::new(zstd::stream::read::Decoder::with_buffer(file)?)),
    })
}

/// A reader that fails once it has given more than its budget's bytes.
struct Limited {
    inner: Box<dyn Read>,
    given: u64,
    budget: Budget,
}

impl Read for Limited {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // At most one byte past the budget is asked for, so exceeding it
        // is seen without reading (or holding) more.
        let left = self.budget.bytes - self.given.min(self.budget.bytes);
        let room = usize::try_from(left)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let take = buf.len().min(room);
        let n = self.inner.read(&mut buf[..take])?;
        self.given += n as u64;
        if self.given > self.budget.bytes {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "decompresses to more than {} bytes, {}",
                    self.budget.bytes, self.budget.rule
                ),
            ));
        }
        Ok(n)
    }
}

/// Whether text bytes look binary: a NUL byte (git's test) or invalid UTF-8.
pub fn is_binary(bytes: &[u8]) -> bool {
    bytes.contains(&0) || std::str::from_utf8(bytes).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(path: &str) -> SourceConfig {
        SourceConfig {
            path: path.into(),
            ..SourceConfig::default()
        }
    }

    fn names(l: &Listing) -> Vec<String> {
        l.files
            .iter()
            .map(|f| f.shown.display().to_string())
            .collect()
    }

    #[test]
    fn directories_and_globs_list_files_in_name_order_filtered() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for (p, bytes) in [
            ("code/src/b.rs", 10),
            ("code/src/a.rs", 10),
            ("code/src/gen/big.rs", 5000),
            ("code/README.md", 10),
            ("code/target/x.rs", 10),
            ("code/.git/HEAD", 10),
            ("code/tests/t.rs", 10),
        ] {
            let f = root.join(p);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, "x".repeat(bytes)).unwrap();
        }
        let mut c = cfg("code");
        c.exclude = vec!["target".into(), "tests/**".into()];
        c.max_file_bytes = Some(1000);
        let l = list(&c, &root.join("code")).unwrap();
        assert_eq!(
            names(&l),
            ["code/README.md", "code/src/a.rs", "code/src/b.rs"]
        );
        assert_eq!(l.skipped_large, 1);
        assert!(l.many);
        c.include = vec!["*.rs".into()];
        assert_eq!(
            names(&list(&c, &root.join("code")).unwrap()),
            ["code/src/a.rs", "code/src/b.rs"]
        );
        let mut g = cfg("code/**/*.rs");
        g.exclude = vec!["target".into()];
        let l = list(&g, &root.join("code/**/*.rs")).unwrap();
        assert_eq!(
            names(&l),
            [
                "code/src/a.rs",
                "code/src/b.rs",
                "code/src/gen/big.rs",
                "code/tests/t.rs"
            ]
        );
        let shallow = list(&cfg("code/src/*.rs"), &root.join("code/src/*.rs")).unwrap();
        assert_eq!(names(&shallow), ["code/src/a.rs", "code/src/b.rs"]);
        let e = list(&cfg("code/*.py"), &root.join("code/*.py")).unwrap_err();
        assert!(e.contains("matches no file"), "{e}");
        let one = list(&cfg("code/README.md"), &root.join("code/README.md")).unwrap();
        assert!(!one.many && one.files.len() == 1);
    }

    #[test]
    fn formats_are_told_from_names_or_refused() {
        let c = cfg("x");
        let d = |n: &str| detect(&c, Path::new(n));
        assert_eq!(
            d("a.jsonl.gz"),
            Ok((SourceFormat::Jsonl, Compression::Gzip))
        );
        assert_eq!(
            d("a.JSONL.zst"),
            Ok((SourceFormat::Jsonl, Compression::Zstd))
        );
        assert_eq!(d("a.json"), Ok((SourceFormat::Json, Compression::None)));
        assert_eq!(
            d("a.parquet"),
            Ok((SourceFormat::Parquet, Compression::None))
        );
        assert_eq!(
            d("wiki.test.raw"),
            Ok((SourceFormat::Text, Compression::None))
        );
        assert!(d("a.parquet.gz")
            .unwrap_err()
            .contains("compressed Parquet"));
        for bad in ["main.rs", "data", "a.csv", "x.gz"] {
            assert!(d(bad).unwrap_err().contains("set format"), "{bad}");
        }
        let text = SourceConfig {
            format: Some(SourceFormat::Text),
            ..cfg("x")
        };
        assert_eq!(
            detect(&text, Path::new("main.rs.gz")),
            Ok((SourceFormat::Text, Compression::Gzip))
        );
        assert!(is_binary(b"a\0b") && is_binary(&[0xff, 0xfe]) && !is_binary("日本".as_bytes()));
    }

    /// A compressed file gives its bytes up to the budget, and an error
    /// naming the budget's rule on the byte past it; the budget is the
    /// source's `max_file_bytes` in a directory or glob source.
    #[test]
    fn a_compressed_file_is_read_up_to_its_budget() {
        use std::io::Write;
        let d = tempfile::tempdir().unwrap();
        let text = "0123456789".repeat(100);
        let gz = d.path().join("a.txt.gz");
        let mut enc = flate2::write::GzEncoder::new(
            std::fs::File::create(&gz).unwrap(),
            flate2::Compression::default(),
        );
        enc.write_all(text.as_bytes()).unwrap();
        enc.finish().unwrap();
        let zst = d.path().join("a.txt.zst");
        std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        let mut c = cfg("dir");
        c.max_file_bytes = Some(1000);
        assert_eq!(Budget::of(&c, true).bytes, 1000);
        assert_eq!(Budget::of(&c, false).bytes, MAX_DECOMPRESSED_BYTES);
        for (path, compression) in [(&gz, Compression::Gzip), (&zst, Compression::Zstd)] {
            let mut all = String::new();
            open(path, compression, Budget::of(&c, true))
                .unwrap()
                .read_to_string(&mut all)
                .unwrap();
            assert_eq!(all, text);
            c.max_file_bytes = Some(999);
            let mut part = Vec::new();
            let e = open(path, compression, Budget::of(&c, true))
                .unwrap()
                .read_to_end(&mut part)
                .unwrap_err();
            assert!(
                e.to_string().starts_with(
                    "decompresses to more than 999 bytes, the source's max_file_bytes"
                ),
                "{e}"
            );
            assert!(part.len() <= 1000, "{}", part.len());
            c.max_file_bytes = Some(1000);
        }
    }
}
