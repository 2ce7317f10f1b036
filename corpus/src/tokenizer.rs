//! Tokenization with the model's own tokenizer (llama.cpp, vocabulary-only
//! load; images through the model's mmproj with mtmd, [`super::vision`]),
//! run in parallel with rayon behind a [`Tokenizer`] trait so the corpus
//! logic can be tested without a model.

use super::chat::{Chat, ChatKwargs};
use super::error::CorpusError;
use super::media::ImageRef;
use super::template::{ChatTemplate, TemplateError};
use super::vision::{self, ImageTokens};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use llama::{Model, Vision};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Inputs larger than this (bytes) get a progress bar.
const PROGRESS_MIN_BYTES: usize = 4 << 20;

pub use runfiles::manifest::TokenizerInfo;

/// A tokenizer as the corpus stage uses it.
pub trait Tokenizer: Sync {
    /// Token ids of `text`, with BOS/EOS added as the model's metadata says;
    /// `special`: parse special-token text (`<|im_start|>`) as special tokens.
    fn tokenize(&self, text: &str, special: bool) -> Vec<i32>;
    /// Token ids of `text` whose media markers stand for `images`, each
    /// image becoming the positions the model's mmproj gives it; a
    /// tokenizer without an mmproj refuses.
    fn tokenize_with_images(
        &self,
        _text: &str,
        _special: bool,
        _images: &[ImageRef],
    ) -> Result<ImageTokens, String> {
        Err(
            "the tokenizer has no mmproj loaded ([model] mmproj), so it cannot tokenize images"
                .into(),
        )
    }
    /// Renders a conversation with the model's chat template, `kwargs` in
    /// the template's context.
    fn apply_chat_template(&self, chat: &Chat, kwargs: &ChatKwargs) -> Result<String, String>;
    /// Renders a conversation followed by the chat template's generation
    /// prompt (the response phase's prompts).
    fn apply_chat_template_prompt(
        &self,
        _chat: &Chat,
        _kwargs: &ChatKwargs,
    ) -> Result<String, String> {
        Err("this tokenizer cannot render a generation prompt".into())
    }
    /// The text of token ids (special tokens written as their text), as
    /// the vocabulary writes them; bytes that are not UTF-8 are replaced.
    fn detokenize(&self, _tokens: &[i32]) -> Result<String, String> {
        Err("this tokenizer cannot turn token ids into text".into())
    }
    /// Description for the manifest.
    fn info(&self) -> TokenizerInfo;
}

/// A GGUF model's tokenizer, loaded without weights, with the model's
/// mmproj when images are tokenized.
pub struct LlamaTokenizer {
    // Declared first: mtmd's context refers to the model, so it is dropped
    // before it.
    vision: Option<(Vision, String)>,
    model: Model,
    /// The model file, named when its chat template exceeds its budget.
    path: PathBuf,
    template: Option<CString>,
    /// The template compiled as Jinja; `None` (with a warning at load) where
    /// the Jinja engine cannot compile it and llama.cpp's built-in
    /// renderer stands in.
    jinja: Option<ChatTemplate>,
}

impl LlamaTokenizer {
    /// Loads the vocabulary (and chat template) of a GGUF file and, when
    /// `mmproj` is given, that mmproj through mtmd beside it.
    pub fn load(path: &Path, mmproj: Option<&Path>) -> Result<LlamaTokenizer, CorpusError> {
        let fail = |message: String| CorpusError::Model {
            path: path.to_path_buf(),
            message,
        };
        if !path.is_file() {
            return Err(CorpusError::Io {
                path: path.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "model file not found"),
            });
        }
        // A repeated token string (which would abort llama.cpp) is refused
        // by name before llama.cpp sees the file.
        let model = Model::load_vocab(path).map_err(|e| match e {
            llama::LlamaError::Vocab(e) => CorpusError::from(e),
            e => fail(format!("llama.cpp cannot load its vocabulary ({e})")),
        })?;
        let template = model.chat_template();
        let jinja = match &template {
            Some(t) => jinja_template(&model, t).map_err(&fail)?,
            None => None,
        };
        let vision = match mmproj {
            Some(m) => {
                let sha = super::sha256_file(m)?;
                let vision =
                    vision::load(m, &model, path).map_err(|message| CorpusError::Source {
                        path: m.to_path_buf(),
                        message,
                    })?;
                Some((vision, sha))
            }
            None => None,
        };
        Ok(LlamaTokenizer {
            vision,
            model,
            path: path.to_path_buf(),
            template,
            jinja,
        })
    }

    /// A template that writes BOS itself, plus the tokenizer's BOS: keep one.
    fn one_bos(&self, ids: &mut Vec<i32>, special: bool) {
        let bos = self.model.bos();
        if special && self.model.add_bos() && ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
}

impl Tokenizer for LlamaTokenizer {
    fn tokenize(&self, text: &str, special: bool) -> Vec<i32> {
        let mut ids = self.model.tokenize(text, true, special);
        self.one_bos(&mut ids, special);
        ids
    }

    fn tokenize_with_images(
        &self,
        text: &str,
        special: bool,
        images: &[ImageRef],
    ) -> Result<ImageTokens, String> {
        let Some((vision, _)) = &self.vision else {
            return Err("the corpus has images, but [model] mmproj is not set".into());
        };
        let (mut ids, mut spans) = vision::tokenize(vision, text, special, images)?;
        let before = ids.len();
        self.one_bos(&mut ids, special);
        if ids.len() < before {
            for s in &mut spans {
                s.start -= 1;
            }
        }
        Ok((ids, spans))
    }

    fn apply_chat_template(&self, chat: &Chat, kwargs: &ChatKwargs) -> Result<String, String> {
        self.render(chat, kwargs, false)
    }

    fn apply_chat_template_prompt(
        &self,
        chat: &Chat,
        kwargs: &ChatKwargs,
    ) -> Result<String, String> {
        self.render(chat, kwargs, true)
    }

    fn detokenize(&self, tokens: &[i32]) -> Result<String, String> {
        let n_vocab = self.model.n_vocab();
        let mut bytes = Vec::new();
        for &t in tokens {
            if usize::try_from(t).map_or(true, |t| t >= n_vocab) {
                return Err(format!(
                    "token id {t} is outside the vocabulary of {n_vocab}"
                ));
            }
            bytes.extend(self.model.token_to_piece(t, true));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn info(&self) -> TokenizerInfo {
        self.info_of()
    }
}

impl LlamaTokenizer {
    /// Renders `chat` with the model's template, with its generation prompt
    /// after it or not.
    fn render(&self, chat: &Chat, kwargs: &ChatKwargs, prompt: bool) -> Result<String, String> {
        let template = self
            .template
            .as_ref()
            .ok_or("the model has no chat template (tokenizer.chat_template), so chat records cannot be rendered")?;
        if let Some(jinja) = &self.jinja {
            let rendered = match prompt {
                true => jinja.render_prompt(chat, kwargs),
                false => jinja.render(chat, kwargs),
            };
            return rendered.map_err(|e| match e {
                TemplateError::OverBudget(why) => format!("model {}: {why}", self.path.display()),
                TemplateError::Invalid(why) => why,
            });
        }
        let contents: Vec<String> = chat.messages.iter().map(|m| m.legacy_content()).collect();
        let messages: Vec<(&str, &str)> = chat
            .messages
            .iter()
            .zip(&contents)
            .map(|(m, c)| (m.role.template_name(), c.as_str()))
            .collect();
        llama::apply_chat_template(template, &messages, prompt)
            .map_err(|e| format!("the model's chat template failed ({e})"))
    }

    /// Description for the manifest.
    fn info_of(&self) -> TokenizerInfo {
        let m = &self.model;
        TokenizerInfo {
            kind: "llama.cpp".into(),
            vocab_type: m.vocab_type(),
            n_vocab: m.n_vocab() as u32,
            bos: m.bos(),
            eos: m.eos(),
            add_bos: m.add_bos(),
            add_eos: m.add_eos(),
            chat_template_sha256: self
                .template
                .as_ref()
                .map(|t| hex::encode(Sha256::digest(t.to_bytes()))),
            mmproj_sha256: self.vision.as_ref().map(|(_, sha)| sha.clone()),
        }
    }
}

/// The model's chat template compiled as Jinja, with the vocabulary's BOS
/// and EOS texts and today's date; `None`, with a warning, when the engine
/// cannot compile it (llama.cpp's built-in renderer then stands in, as
/// llama-server without `--jinja`); an error when its probe renderings
/// exceed the template budget.
fn jinja_template(model: &Model, template: &CString) -> Result<Option<ChatTemplate>, String> {
    let piece = |t| String::from_utf8_lossy(&model.token_to_piece(t, true)).into_owned();
    let source = template.to_string_lossy();
    match ChatTemplate::new(
        &source,
        &piece(model.bos()),
        &piece(model.eos()),
        chrono::Utc::now(),
    ) {
        Ok(t) => Ok(Some(t)),
        Err(TemplateError::OverBudget(why)) => Err(why),
        Err(TemplateError::Invalid(e)) => {
            tracing::warn!(
                "{e}: chat records are rendered by llama.cpp's built-in templates instead, \
                 which may differ from what llama-server --jinja serves"
            );
            Ok(None)
        }
    }
}

/// Tokenizes every `(text, special, images)` in parallel on the current
/// rayon pool (a text with images through [`Tokenizer::tokenize_with_images`]),
/// with a progress bar (in bytes) when the input is large and stderr a
/// terminal. The first failure is returned with the index of its text.
pub fn tokenize_all(
    tokenizer: &dyn Tokenizer,
    texts: &[(String, bool, &[ImageRef])],
) -> Result<Vec<ImageTokens>, (usize, String)> {
    let total: usize = texts.iter().map(|(t, _, _)| t.len()).sum();
    let bar = if total >= PROGRESS_MIN_BYTES {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("tokenizing {bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let out = texts
        .par_iter()
        .enumerate()
        .map(|(i, (text, special, images))| {
            let tokens = if images.is_empty() {
                Ok((tokenizer.tokenize(text, *special), Vec::new()))
            } else {
                tokenizer.tokenize_with_images(text, *special, images)
            };
            bar.inc(text.len() as u64);
            tokens.map_err(|e| (i, e))
        })
        .collect::<Vec<_>>()
        // In text order: a failure names the first bad text, however the
        // threads ran.
        .into_iter()
        .collect();
    bar.finish_and_clear();
    out
}

/// A stand-in tokenizer for tests: one token per UTF-8 byte (so Japanese
/// text has about three tokens per character), and a plain-text chat format.
#[cfg(test)]
pub struct ByteTokenizer;

#[cfg(test)]
impl Tokenizer for ByteTokenizer {
    fn tokenize(&self, text: &str, _special: bool) -> Vec<i32> {
        text.bytes().map(i32::from).collect()
    }

    fn apply_chat_template(&self, chat: &Chat, _kwargs: &ChatKwargs) -> Result<String, String> {
        Ok(chat
            .messages
            .iter()
            .map(|m| format!("<{}>{}\n", m.role.as_str(), m.content))
            .collect())
    }

    fn apply_chat_template_prompt(
        &self,
        chat: &Chat,
        kwargs: &ChatKwargs,
    ) -> Result<String, String> {
        Ok(self.apply_chat_template(chat, kwargs)? + "<assistant>")
    }

    fn detokenize(&self, tokens: &[i32]) -> Result<String, String> {
        let bytes: Vec<u8> = tokens.iter().map(|&t| t as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn info(&self) -> TokenizerInfo {
        TokenizerInfo {
            kind: "bytes".into(),
            n_vocab: 256,
            ..TokenizerInfo::default()
        }
    }
}
