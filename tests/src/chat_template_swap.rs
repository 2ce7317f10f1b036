//! A copy of a GGUF model whose `tokenizer.chat_template` is another text,
//! every other byte of metadata, tensor descriptions and data kept: how the
//! tests give the trained model each family's chat template.

use gguf::read::GgufReader;
use std::io::Write;
use std::path::Path;

const KEY: &str = "tokenizer.chat_template";
const GGUF_TYPE_STRING: u32 = 8;

/// Writes `dst`: `src` with `template` as its chat template (added when
/// `src` has none).
pub fn with_chat_template(src: &Path, dst: &Path, template: &str) {
    let header = GgufReader::open(src).unwrap().header;
    let bytes = std::fs::read(src).unwrap();
    let mut entry = Vec::new();
    entry.extend_from_slice(&(KEY.len() as u64).to_le_bytes());
    entry.extend_from_slice(KEY.as_bytes());
    entry.extend_from_slice(&GGUF_TYPE_STRING.to_le_bytes());
    entry.extend_from_slice(&(template.len() as u64).to_le_bytes());
    entry.extend_from_slice(template.as_bytes());

    // magic, version, tensor count, then the metadata count.
    let mut out = bytes[..16].to_vec();
    let had = header.kv.iter().any(|(k, _)| k == KEY);
    let n_kv = header.kv.len() as u64 + u64::from(!had);
    out.extend_from_slice(&n_kv.to_le_bytes());
    for ((key, _), range) in header.kv.iter().zip(&header.kv_ranges) {
        match key == KEY {
            true => out.extend_from_slice(&entry),
            false => out.extend_from_slice(&bytes[range.start as usize..range.end as usize]),
        }
    }
    if !had {
        out.extend_from_slice(&entry);
    }
    let infos_at = header.kv_ranges.last().map_or(24, |r| r.end) as usize;
    let infos_len: usize = header
        .tensors
        .iter()
        .map(|t| 8 + t.name.len() + 4 + 8 * t.dims.len() + 4 + 8)
        .sum();
    out.extend_from_slice(&bytes[infos_at..infos_at + infos_len]);
    let align = header.alignment as usize;
    out.resize(out.len().div_ceil(align) * align, 0);
    out.extend_from_slice(&bytes[header.data_offset as usize..]);
    std::fs::File::create(dst).unwrap().write_all(&out).unwrap();
}
