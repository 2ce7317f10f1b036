//! A deterministic byte-level BPE vocabulary for generated models.
//!
//! 256 byte tokens (GPT-2's byte-to-unicode mapping), merges learnt from a
//! built-in multilingual text (so Japanese characters become multi-byte
//! pieces and characters and tokens differ), and ChatML special tokens.

use std::collections::BTreeMap;

/// Special tokens, in the order they are appended after the merged pieces.
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// llama.cpp token types.
const TOKEN_TYPE_NORMAL: i32 = 1;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_UNUSED: i32 = 5;

/// ChatML template, which llama.cpp recognises by its `<|im_start|>` marker.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TRAINING_TEXT: &str = "\
The router sends every token to a few experts, and the experts that are used most \
are not always the ones that matter most. Calibration data should cover every domain. \
Mixture-of-Experts models keep many feed-forward networks per layer; pruning removes \
the experts that contribute least to the output. The quick brown fox jumps over the lazy dog. \
fn main() { let total: u64 = values.iter().map(|v| v * 2).sum(); println!(\"{total}\"); } \
def score(expert, counts): return counts[expert] / max(1, sum(counts)) \
東京は日本の首都です。専門家の選択はトークンごとに行われます。\
私たちは大規模な言語モデルの専門家を評価します。データの分布を確認してください。\
今日は天気が良いので、公園を散歩しました。猫が日向で寝ています。\
ルーターは各トークンを少数の専門家に送ります。重要度行列を計算します。\
Die Experten werden nach ihrer Bedeutung bewertet. Les experts sont choisis par le routeur. \
user assistant system question answer: What is the capital of Japan? Tokyo is the capital.";

/// The byte-to-unicode mapping of GPT-2's byte-level BPE.
pub fn byte_to_unicode() -> [char; 256] {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).collect();
    printable.extend(0xA1u32..=0xAC);
    printable.extend(0xAEu32..=0xFF);
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        map[b as usize] = if printable.contains(&b) {
            char::from_u32(b).expect("latin-1 code point")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("valid code point")
        };
    }
    map
}

/// Tokens, token types and merges of the generated vocabulary.
pub struct Vocab {
    /// Token strings in the byte-level unicode encoding.
    pub tokens: Vec<String>,
    /// llama.cpp token type per token.
    pub token_types: Vec<i32>,
    /// Merge rules `"a b"`, in priority order.
    pub merges: Vec<String>,
}

impl Vocab {
    /// Appends unused tokens (`<|unused_N|>`, which neither the BPE merges
    /// nor the special-token matcher ever produce) until the vocabulary has
    /// `n_vocab` tokens: a real model's vocabulary size, so its output head
    /// and logits rows have their real width. A vocabulary already that
    /// large is left as it is.
    pub fn pad_to(&mut self, n_vocab: usize) {
        for i in 0..n_vocab.saturating_sub(self.tokens.len()) {
            self.tokens.push(format!("<|unused_{i}|>"));
            self.token_types.push(TOKEN_TYPE_UNUSED);
        }
    }

    /// Id of a special token.
    pub fn special_id(&self, token: &str) -> u32 {
        self.tokens
            .iter()
            .position(|t| t == token)
            .expect("special token present") as u32
    }
}

/// Learns `n_merges` BPE merges over the built-in text (deterministic: ties
/// broken by the pair's text).
pub fn build(n_merges: usize) -> Vocab {
    let map = byte_to_unicode();
    let mut tokens: Vec<String> = map.iter().map(|c| c.to_string()).collect();
    // Words: split before spaces and around CJK punctuation, as pre-tokenizers do.
    let mut words: BTreeMap<Vec<String>, usize> = BTreeMap::new();
    for word in TRAINING_TEXT.split_inclusive([' ', '。', '、']) {
        let symbols: Vec<String> = word.bytes().map(|b| map[b as usize].to_string()).collect();
        *words.entry(symbols).or_default() += 1;
    }
    let mut merges = Vec::with_capacity(n_merges);
    for _ in 0..n_merges {
        let mut pairs: BTreeMap<(String, String), usize> = BTreeMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *pairs.entry((p[0].clone(), p[1].clone())).or_default() += n;
            }
        }
        let Some(((a, b), _)) = pairs
            .into_iter()
            .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(&x.0)))
        else {
            break;
        };
        let joined = format!("{a}{b}");
        words = words
            .into_iter()
            .map(|(w, n)| {
                let mut out = Vec::with_capacity(w.len());
                let mut i = 0;
                while i < w.len() {
                    if i + 1 < w.len() && w[i] == a && w[i + 1] == b {
                        out.push(joined.clone());
                        i += 2;
                    } else {
                        out.push(w[i].clone());
                        i += 1;
                    }
                }
                (out, n)
            })
            .fold(BTreeMap::new(), |mut m, (w, n)| {
                *m.entry(w).or_default() += n;
                m
            });
        merges.push(format!("{a} {b}"));
        tokens.push(joined);
    }
    let mut token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
    for s in SPECIAL_TOKENS {
        tokens.push(s.to_string());
        token_types.push(TOKEN_TYPE_CONTROL);
    }
    Vocab {
        tokens,
        token_types,
        merges,
    }
}

/// Writes the vocabulary's tokenizer metadata: a GPT-2 BPE with Qwen2's
/// pre-tokenizer, the special tokens and the chat template.
pub fn write_tokenizer(g: &mut gguf::write::GgufWriter, vocab: &Vocab) {
    use gguf::write::Value;
    g.kv("tokenizer.ggml.model", Value::Str("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::Str("qwen2".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::StrArray(vocab.tokens.clone()),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::I32Array(vocab.token_types.clone()),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::StrArray(vocab.merges.clone()),
        )
        .kv(
            "tokenizer.ggml.bos_token_id",
            Value::U32(vocab.special_id("<|endoftext|>")),
        )
        .kv(
            "tokenizer.ggml.eos_token_id",
            Value::U32(vocab.special_id("<|im_end|>")),
        )
        .kv(
            "tokenizer.ggml.padding_token_id",
            Value::U32(vocab.special_id("<|endoftext|>")),
        )
        .kv("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .kv("tokenizer.chat_template", Value::Str(CHAT_TEMPLATE.into()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_has_multibyte_japanese_pieces_and_specials() {
        let v = build(400);
        let map = byte_to_unicode();
        let decode = |t: &str| -> Vec<u8> {
            t.chars()
                .map(|c| map.iter().position(|m| *m == c).unwrap() as u8)
                .collect()
        };
        let japanese = v
            .tokens
            .iter()
            .filter(|t| !SPECIAL_TOKENS.contains(&t.as_str()))
            .filter(|t| {
                std::str::from_utf8(&decode(t)).is_ok_and(|s| s.chars().any(|c| c as u32 > 0x3000))
            })
            .count();
        assert!(japanese > 5, "only {japanese} Japanese pieces");
        assert_eq!(v.special_id("<|im_end|>") as usize, v.tokens.len() - 1);
        assert_eq!(v.tokens.len(), v.token_types.len());
        let unique: std::collections::BTreeSet<_> = v.tokens.iter().collect();
        assert_eq!(unique.len(), v.tokens.len(), "tokens are unique");
    }

    #[test]
    fn padding_keeps_every_learnt_token_and_reaches_the_size() {
        let learnt = build(400);
        let mut v = build(400);
        v.pad_to(1000);
        assert_eq!((v.tokens.len(), v.token_types.len()), (1000, 1000));
        assert_eq!(v.tokens[..learnt.tokens.len()], learnt.tokens[..]);
        assert_eq!(v.special_id("<|im_end|>"), learnt.special_id("<|im_end|>"));
        let unique: std::collections::BTreeSet<_> = v.tokens.iter().collect();
        assert_eq!(unique.len(), 1000, "tokens are unique");
        v.pad_to(10);
        assert_eq!(v.tokens.len(), 1000);
    }
}
