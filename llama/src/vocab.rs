//! A model's vocabulary and chat template: a vocabulary-only load (no
//! weights) and llama.cpp's own tokenizer, detokenizer and built-in chat
//! templates, as the corpus stage tokenizes records.

use super::{init_backend, LlamaError, Model};
use llama_cpp_sys_2 as sys;
use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

impl Model {
    /// Loads the vocabulary, chat template and hyperparameters of a GGUF
    /// file without its weights (what tokenizing needs).
    pub fn load_vocab(path: &Path) -> Result<Model, LlamaError> {
        // llama.cpp aborts the process on a repeated token string: refuse
        // such a vocabulary by name before it sees the file.
        gguf::vocab_check::check_file(path)?;
        init_backend();
        let err = || LlamaError::ModelLoad {
            path: path.display().to_string(),
        };
        let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| err())?;
        // SAFETY: default params are plain data; the path outlives the call.
        let raw = unsafe {
            let mut params = sys::llama_model_default_params();
            params.vocab_only = true;
            sys::llama_model_load_from_file(c_path.as_ptr(), params)
        };
        NonNull::new(raw).map(|ptr| Model { ptr }).ok_or_else(err)
    }

    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is live; its vocabulary lives as long as it does.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    /// Token ids of `text`: `add_special` adds BOS/EOS as the model's
    /// metadata says; `parse_special` reads special-token text
    /// (`<|im_start|>`) as the special token.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<i32> {
        let len = i32::try_from(text.len()).expect("a text under 2 GiB");
        let mut ids: Vec<i32> = vec![0; (text.len() / 2).max(8) + usize::from(add_special)];
        for _ in 0..2 {
            let cap = i32::try_from(ids.len()).unwrap_or(i32::MAX);
            // SAFETY: the vocabulary is live; the text is valid for `len`
            // bytes and the output for `cap` ids; llama.cpp writes at most
            // `cap` and returns minus the count it needs when that is short.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr().cast::<c_char>(),
                    len,
                    ids.as_mut_ptr(),
                    cap,
                    add_special,
                    parse_special,
                )
            };
            if n >= 0 {
                ids.truncate(n as usize);
                return ids;
            }
            assert!(n != i32::MIN, "a tokenization over 2^31 tokens");
            ids.resize(n.unsigned_abs() as usize, 0);
        }
        unreachable!("llama_tokenize fits the size it asked for")
    }

    /// The bytes of one token as the vocabulary writes it; `special`:
    /// special tokens as their text (else nothing).
    pub fn token_to_piece(&self, token: i32, special: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 32];
        for _ in 0..2 {
            let cap = i32::try_from(buf.len()).unwrap_or(i32::MAX);
            // SAFETY: the vocabulary is live and the buffer writable for
            // `cap` bytes; llama.cpp returns minus the size it needs when
            // that is short.
            let n = unsafe {
                sys::llama_token_to_piece(
                    self.vocab(),
                    token,
                    buf.as_mut_ptr().cast::<c_char>(),
                    cap,
                    0,
                    special,
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return buf;
            }
            buf.resize(n.unsigned_abs() as usize, 0);
        }
        unreachable!("llama_token_to_piece fits the size it asked for")
    }

    /// The vocabulary's kind as llama.cpp names it (`SPM`, `BPE`, `WPM`,
    /// `UGM`, `RWKV`, `PLAMO2`, `TEST`, `NONE`).
    pub fn vocab_type(&self) -> String {
        // SAFETY: the vocabulary is live.
        let t = unsafe { sys::llama_vocab_type(self.vocab()) };
        match t {
            sys::LLAMA_VOCAB_TYPE_NONE => "NONE".into(),
            sys::LLAMA_VOCAB_TYPE_SPM => "SPM".into(),
            sys::LLAMA_VOCAB_TYPE_BPE => "BPE".into(),
            sys::LLAMA_VOCAB_TYPE_WPM => "WPM".into(),
            sys::LLAMA_VOCAB_TYPE_UGM => "UGM".into(),
            sys::LLAMA_VOCAB_TYPE_RWKV => "RWKV".into(),
            sys::LLAMA_VOCAB_TYPE_PLAMO2 => "PLAMO2".into(),
            sys::LLAMA_VOCAB_TYPE_TEST => "TEST".into(),
            other => format!("type {other}"),
        }
    }

    /// The beginning-of-sequence token.
    pub fn bos(&self) -> i32 {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_bos(self.vocab()) }
    }

    /// The end-of-sequence token.
    pub fn eos(&self) -> i32 {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_eos(self.vocab()) }
    }

    /// Whether tokenizing adds BOS (the model's metadata says).
    pub fn add_bos(&self) -> bool {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_get_add_bos(self.vocab()) }
    }

    /// Whether tokenizing adds EOS (the model's metadata says).
    pub fn add_eos(&self) -> bool {
        // SAFETY: the vocabulary is live.
        unsafe { sys::llama_vocab_get_add_eos(self.vocab()) }
    }

    /// The model's default chat template (`tokenizer.chat_template`), if
    /// it has one.
    pub fn chat_template(&self) -> Option<CString> {
        // SAFETY: the model is live; a null name asks for the default
        // template, returned as a string the model owns (copied here).
        unsafe {
            let p = sys::llama_model_chat_template(self.ptr.as_ptr(), std::ptr::null());
            (!p.is_null()).then(|| CStr::from_ptr(p).to_owned())
        }
    }
}

/// Renders `messages` (role, content) with `template` through llama.cpp's
/// built-in templates (`llama_chat_apply_template`, no Jinja), with the
/// assistant's generation prompt after them when `add_assistant`.
pub fn apply_chat_template(
    template: &CStr,
    messages: &[(&str, &str)],
    add_assistant: bool,
) -> Result<String, LlamaError> {
    let fail = |why: String| LlamaError::ChatTemplate(why);
    let owned = messages
        .iter()
        .map(|(role, content)| Ok((CString::new(*role)?, CString::new(*content)?)))
        .collect::<Result<Vec<_>, std::ffi::NulError>>()
        .map_err(|e| fail(format!("a message cannot be passed to llama.cpp ({e})")))?;
    let chat: Vec<sys::llama_chat_message> = owned
        .iter()
        .map(|(role, content)| sys::llama_chat_message {
            role: role.as_ptr(),
            content: content.as_ptr(),
        })
        .collect();
    let total: usize = messages.iter().map(|(r, c)| r.len() + c.len()).sum();
    let mut buf = vec![0u8; total * 2];
    for _ in 0..2 {
        let cap =
            i32::try_from(buf.len()).map_err(|_| fail("the conversation is over 2 GiB".into()))?;
        // SAFETY: the template and every message are NUL-terminated strings
        // that outlive the call; the buffer is writable for `cap` bytes and
        // llama.cpp writes at most that, returning the length it needs.
        let n = unsafe {
            sys::llama_chat_apply_template(
                template.as_ptr(),
                chat.as_ptr(),
                chat.len(),
                add_assistant,
                buf.as_mut_ptr().cast::<c_char>(),
                cap,
            )
        };
        if n < 0 {
            return Err(fail(format!(
                "failed with code {n} (not a template llama.cpp knows)"
            )));
        }
        if n as usize <= buf.len() {
            buf.truncate(n as usize);
            return String::from_utf8(buf).map_err(|e| fail(format!("not UTF-8 ({e})")));
        }
        buf.resize(n as usize, 0);
    }
    unreachable!("llama_chat_apply_template fits the size it asked for")
}
