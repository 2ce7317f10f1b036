//! Chat rendered by the model's own Jinja template (`tokenizer.chat_template`),
//! as llama-server renders it with `--jinja`, so calibration sees the tokens
//! the model is served with: thinking blocks, tool definitions and tool
//! calls as the template writes them.
//!
//! The engine is minijinja (a well-kept Jinja2 implementation) set up as
//! Hugging Face's `apply_chat_template` sets up Jinja2, the renderer these
//! templates are written for: `trim_blocks`, `lstrip_blocks`, loop controls,
//! Python's string and dict methods, `tojson` as Python's `json.dumps`
//! ([`pyjson`]), `raise_exception` and `strftime_now`.
//!
//! Messages go to the template as llama-server hands them over (llama.cpp
//! `common/chat.cpp`): each normalised to `role`, `content` (a string, `""`
//! for none), `reasoning_content`, `name`, `tool_call_id` and `tool_calls`
//! (`{type, function: {name, arguments}, id}`); `developer` renamed
//! `system` except for gpt-oss's template (which has `<|channel|>`); a
//! leading system message merged into the next one when the template
//! ignores system messages; tool-call arguments given as JSON text parsed
//! into objects when the template writes object arguments. What a template
//! supports is found as llama.cpp finds it, by rendering probe
//! conversations, here judged by the text they render. A template that
//! does not write tool calls gets them in the assistant's text as
//! `<tool_call>` blocks ([`Message::legacy_content`]) instead of losing
//! them. The context holds `bos_token`, `eos_token`, `date_string` and
//! `datetime` (llama-server's) and the config's `chat_template_kwargs`;
//! `add_generation_prompt` is false (whole conversations are calibrated),
//! except in [`ChatTemplate::render_prompt`]: a conversation up to a user
//! turn with the generation prompt, which tells where an assistant turn
//! starts (the generation check's prompts end there).
//!
//! Every rendering (the probes included) runs under a [`budget`]: fuel,
//! output bytes and heap; a template that exceeds it is refused
//! ([`TemplateError::OverBudget`]), and so is every later rendering with it.

pub mod budget;
pub mod pyjson;

use crate::chat::{Chat, ChatKwargs, Message, Role};
use budget::{Stopped, FUEL, HEAP_CAP, OUTPUT_CAP};
use chrono::{DateTime, Utc};
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{json, Map, Value as Json};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Why a chat template cannot be used or cannot render a conversation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// The template does not compile, refuses the conversation, or fails
    /// on it.
    #[error("{0}")]
    Invalid(String),
    /// A rendering exceeded the [`budget`] (the message names the limit).
    #[error("{0}")]
    OverBudget(String),
}

/// The chat template a model carries, compiled, with what it supports.
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// Set once a rendering exceeded its budget: the template is refused
    /// from then on.
    over_budget: Arc<AtomicBool>,
    /// What every rendering's context holds besides the conversation:
    /// `bos_token`, `eos_token`, `datetime`, `date_string`.
    base_context: Map<String, Json>,
    caps: Caps,
}

/// What a template does with the parts of a conversation, found by
/// rendering probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// It writes a system message's text.
    pub system_role: bool,
    /// It writes an assistant turn's `tool_calls`.
    pub tool_calls: bool,
    /// It writes tool-call arguments given as an object.
    pub object_arguments: bool,
    /// It takes the `developer` role itself (gpt-oss).
    pub developer_role: bool,
}

const TEMPLATE: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source` as llama-server would; `bos_token` and
    /// `eos_token` are the vocabulary's texts of those tokens, `now` the
    /// time `strftime_now` and `date_string` tell. A template whose probe
    /// renderings exceed the budget is refused.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
        now: DateTime<Utc>,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", move |format: String| -> Value {
            Value::from(now.format(&format).to_string())
        });
        env.add_template_owned(TEMPLATE, source.to_string())
            .map_err(|e| {
                TemplateError::Invalid(format!("the chat template does not parse as Jinja ({e:#})"))
            })?;
        let mut base_context = Map::new();
        base_context.insert("bos_token".into(), bos_token.into());
        base_context.insert("eos_token".into(), eos_token.into());
        base_context.insert("datetime".into(), now.format("%b %d %Y").to_string().into());
        base_context.insert(
            "date_string".into(),
            now.format("%d %b %Y").to_string().into(),
        );
        let mut template = ChatTemplate {
            env: Arc::new(env),
            over_budget: Arc::new(AtomicBool::new(false)),
            base_context,
            // What llama-server assumes until the probes tell.
            caps: Caps {
                system_role: true,
                tool_calls: true,
                object_arguments: false,
                developer_role: source.contains("<|channel|>"),
            },
        };
        template.caps = template.probe()?;
        Ok(template)
    }

    /// What the template was found to support.
    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Renders a whole conversation (no generation prompt) with `kwargs`
    /// (`enable_thinking`, `reasoning_effort`, ...) in its context.
    pub fn render(&self, chat: &Chat, kwargs: &ChatKwargs) -> Result<String, TemplateError> {
        let messages = self
            .messages(&chat.messages)
            .map_err(TemplateError::Invalid)?;
        self.render_json(messages, chat.tools.as_ref(), kwargs, false)
    }

    /// Renders a conversation with the generation prompt
    /// (`add_generation_prompt` true): what a server hands the model to
    /// answer its last turn.
    pub fn render_prompt(&self, chat: &Chat, kwargs: &ChatKwargs) -> Result<String, TemplateError> {
        let messages = self
            .messages(&chat.messages)
            .map_err(TemplateError::Invalid)?;
        self.render_json(messages, chat.tools.as_ref(), kwargs, true)
    }

    /// The messages as llama-server hands them to this template.
    fn messages(&self, messages: &[Message]) -> Result<Json, String> {
        let mut out: Vec<Json> = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            out.push(
                self.message(m)
                    .map_err(|e| format!("message {}: {e}", i + 1))?,
            );
        }
        if !self.caps.system_role && out.first().is_some_and(|m| m["role"] == "system") {
            let system = out.remove(0);
            if let Some(next) = out.first_mut() {
                let text = format!(
                    "{}\n{}",
                    system["content"].as_str().unwrap_or_default(),
                    next["content"].as_str().unwrap_or_default()
                );
                next["content"] = Json::String(text);
            }
        }
        Ok(Json::Array(out))
    }

    fn message(&self, m: &Message) -> Result<Json, String> {
        let role = match m.role {
            Role::Developer if !self.caps.developer_role => "system",
            r => r.as_str(),
        };
        let mut out = Map::new();
        out.insert("role".into(), role.into());
        let with_calls = self.caps.tool_calls && !m.tool_calls.is_empty();
        let content = if with_calls || m.tool_calls.is_empty() {
            m.content.clone()
        } else {
            m.legacy_content()
        };
        out.insert("content".into(), content.into());
        if let Some(r) = m.reasoning_content.as_ref().filter(|r| !r.is_empty()) {
            out.insert("reasoning_content".into(), r.clone().into());
        }
        if let Some(n) = m.name.as_ref().filter(|n| !n.is_empty()) {
            out.insert("name".into(), n.clone().into());
        }
        if let Some(id) = m.tool_call_id.as_ref().filter(|id| !id.is_empty()) {
            out.insert("tool_call_id".into(), id.clone().into());
        }
        if with_calls {
            let calls = m
                .tool_calls
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    let arguments = if self.caps.object_arguments {
                        serde_json::from_str::<Json>(&c.arguments).map_err(|e| {
                            format!("tool call {}: arguments are not JSON ({e})", j + 1)
                        })?
                    } else {
                        Json::String(c.arguments.clone())
                    };
                    let mut call = json!({
                        "type": "function",
                        "function": {"name": c.name, "arguments": arguments},
                    });
                    if let Some(id) = c.id.as_ref().filter(|id| !id.is_empty()) {
                        call["id"] = id.clone().into();
                    }
                    Ok(call)
                })
                .collect::<Result<Vec<_>, String>>()?;
            out.insert("tool_calls".into(), Json::Array(calls));
        }
        Ok(Json::Object(out))
    }

    /// Renders the template on `messages` under the budget: on a thread of
    /// its own with [`HEAP_CAP`] bytes of heap, [`FUEL`] instructions and
    /// [`OUTPUT_CAP`] bytes of output.
    fn render_json(
        &self,
        messages: Json,
        tools: Option<&Json>,
        kwargs: &ChatKwargs,
        generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        if self.over_budget.load(Ordering::Acquire) {
            return Err(TemplateError::OverBudget(
                "the chat template exceeded its budget on an earlier rendering".into(),
            ));
        }
        let mut context = Map::new();
        context.insert("messages".into(), messages);
        if let Some(t) = tools {
            context.insert("tools".into(), t.clone());
        }
        context.insert("add_generation_prompt".into(), generation_prompt.into());
        for (k, v) in &self.base_context {
            context.insert(k.clone(), v.clone());
        }
        for (k, v) in kwargs {
            context.insert(k.clone(), v.clone());
        }
        let env = Arc::clone(&self.env);
        let rendered = budget::run_metered(HEAP_CAP, move || {
            let template = env.get_template(TEMPLATE)?;
            let mut out = CappedOutput::default();
            let result = template.render_captured_to(Value::from_serialize(&context), &mut out);
            Ok::<_, Error>((result.map(|_| ()), out))
        });
        let over = |what: String| {
            self.over_budget.store(true, Ordering::Release);
            Err(TemplateError::OverBudget(format!(
                "the chat template {what} per rendering"
            )))
        };
        let (result, out) = match rendered {
            Err(Stopped::Heap) => {
                return over(format!(
                    "asked for more than its heap budget of {HEAP_CAP} bytes"
                ))
            }
            Err(Stopped::Failed(why)) => {
                return Err(TemplateError::Invalid(format!(
                    "the chat template's rendering failed: {why}"
                )))
            }
            Ok(Err(e)) => return Err(TemplateError::Invalid(e.to_string())),
            Ok(Ok(done)) => done,
        };
        if out.over {
            return over(format!(
                "wrote more than its output cap of {OUTPUT_CAP} bytes"
            ));
        }
        match result {
            Err(e) if e.kind() == ErrorKind::OutOfFuel => over(format!(
                "ran more than its fuel of {FUEL} minijinja instructions"
            )),
            Err(e) => Err(TemplateError::Invalid(format!(
                "the chat template failed ({e:#})"
            ))),
            Ok(()) => String::from_utf8(out.bytes).map_err(|_| {
                TemplateError::Invalid("the chat template wrote text that is not UTF-8".into())
            }),
        }
    }

    /// Finds what the template supports by rendering llama.cpp's probe
    /// conversations and looking for their marked parts in the text.
    /// A probe that exceeds the budget refuses the template.
    fn probe(&self) -> Result<Caps, TemplateError> {
        let none = ChatKwargs::new();
        let render = |messages: Json, tools: Option<&Json>| match self
            .render_json(messages, tools, &none, false)
        {
            Ok(text) => Ok(Some(text)),
            Err(TemplateError::Invalid(_)) => Ok(None),
            Err(e) => Err(e),
        };
        let system_role = render(
            json!([
                {"role": "system", "content": "probe system 8c1f"},
                {"role": "user", "content": "User message"}
            ]),
            None,
        )?
        .is_none_or(|text| text.contains("probe system 8c1f"));
        let tools = json!([{
            "type": "function",
            "function": {
                "name": "probe_tool_3e7a",
                "description": "Tool description",
                "parameters": {
                    "type": "object",
                    "properties": {"arg": {"type": "string", "description": "Arg description"}},
                    "required": ["arg"]
                }
            }
        }]);
        let with_arguments = |arguments: Json| {
            json!([
                {"role": "user", "content": "User message"},
                {"role": "assistant", "content": "", "tool_calls": [{
                    "type": "function",
                    "function": {"name": "probe_call_5d2b", "arguments": arguments},
                    "id": "call00001"
                }]},
                {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
                {"role": "assistant", "content": "The tool response was 'tool response'"},
                {"role": "user", "content": "User message"}
            ])
        };
        let as_object = render(
            with_arguments(json!({"arg": "probe value 9a4c"})),
            Some(&tools),
        )?;
        let as_string = render(
            with_arguments(json!("{\"arg\": \"probe value 9a4c\"}")),
            Some(&tools),
        )?;
        let calls = |t: &Option<String>| t.as_ref().is_some_and(|t| t.contains("probe_call_5d2b"));
        let object_arguments = calls(&as_object)
            && as_object
                .as_ref()
                .is_some_and(|t| t.contains("probe value 9a4c"));
        Ok(Caps {
            system_role,
            tool_calls: calls(&as_object) || calls(&as_string),
            object_arguments,
            developer_role: self.caps.developer_role,
        })
    }
}

/// A rendering's output, refusing to grow past [`OUTPUT_CAP`] bytes (the
/// write that would cross it fails, which ends the rendering).
#[derive(Default)]
struct CappedOutput {
    bytes: Vec<u8>,
    over: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > OUTPUT_CAP {
            self.over = true;
            return Err(std::io::Error::other("the output cap is reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `tojson` as Hugging Face defines it: `json.dumps(value,
/// ensure_ascii=False, indent=indent, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    if ensure_ascii == Some(true) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson(ensure_ascii=true) is not supported",
        ));
    }
    let layout = pyjson::Layout {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
    };
    pyjson::dumps(&value, layout)
        .map(Value::from_safe_string)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e))
}

/// The templates' way to refuse a conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}
