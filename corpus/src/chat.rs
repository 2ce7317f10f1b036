//! Chat records: roles and messages, as sources read them and the model's
//! chat template takes them. Messages come in OpenAI's form (`{role,
//! content}`, an assistant turn's `tool_calls` with `content: null`, the
//! `developer` and `tool` roles, content parts, `reasoning_content`) or
//! ShareGPT's (`{from, value}`), or through a field mapping (`role_field`,
//! `content_field`); a record's `tools` (OpenAI's tool definitions) go with
//! its messages.
//!
//! The model's Jinja template (the `template` module) gets every field. The
//! fallback path (llama.cpp's `llama_chat_apply_template`, for a template
//! the Jinja engine cannot compile) takes each message as a role and a text
//! only, so there an assistant turn's tool calls are appended to its
//! content, one block each, as Qwen's and Hermes' templates write them:
//! `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>`
//! ([`Message::legacy_content`]), and `developer` is sent as `system`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A message author. Only known roles (and ShareGPT's names for them) are
/// accepted, so a typo is an error rather than a silently odd prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// OpenAI's instructions role (rendered as `system`).
    Developer,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's answer.
    Tool,
}

impl Role {
    /// Parses a role name: OpenAI's, or ShareGPT's (`human`, `gpt`,
    /// `observation`, `function_call`).
    pub fn parse(s: &str) -> Result<Role, String> {
        match s {
            "system" => Ok(Role::System),
            "developer" => Ok(Role::Developer),
            "user" | "human" => Ok(Role::User),
            "assistant" | "gpt" | "function_call" => Ok(Role::Assistant),
            "tool" | "observation" | "function" => Ok(Role::Tool),
            other => Err(format!(
                "unknown chat role {other:?} (expected system, developer, user, assistant or tool; \
                 ShareGPT's human, gpt, observation)"
            )),
        }
    }

    /// The role's own name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// The name llama.cpp's built-in chat templates get: `developer` as
    /// `system`, the others as they are.
    pub fn template_name(self) -> &'static str {
        match self {
            Role::Developer => "system",
            other => other.as_str(),
        }
    }
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What they wrote (content parts joined; empty for `null`).
    pub content: String,
    /// The model's reasoning before its answer (`reasoning_content`).
    pub reasoning_content: Option<String>,
    /// A tool answer's tool name (`name`).
    pub name: Option<String>,
    /// The call a tool answer answers (`tool_call_id`).
    pub tool_call_id: Option<String>,
    /// An assistant turn's tool calls.
    pub tool_calls: Vec<ToolCall>,
}

/// One tool call of an assistant turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The function called.
    pub name: String,
    /// Its arguments as JSON text (OpenAI's string as given, an object
    /// written compactly in its own key order).
    pub arguments: String,
    /// The call's id, when the record gives one.
    pub id: Option<String>,
}

/// Variables a chat template gets besides the conversation
/// (`[corpus] chat_template_kwargs`).
pub type ChatKwargs = std::collections::BTreeMap<String, Value>;

/// A conversation: its messages and the tools offered to the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chat {
    /// The turns, in order.
    pub messages: Vec<Message>,
    /// OpenAI's tool definitions (`[{type: function, function: {name,
    /// description, parameters}}]`), when the record has them.
    pub tools: Option<Value>,
}

impl Message {
    /// A message of text only.
    pub fn text(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            reasoning_content: None,
            name: None,
            tool_call_id: None,
            tool_calls: Vec::new(),
        }
    }

    /// The content with each tool call appended as a `<tool_call>` block:
    /// the text a template that does not write tool calls gets.
    pub fn legacy_content(&self) -> String {
        let mut text = self.content.clone();
        for call in &self.tool_calls {
            if !text.is_empty() {
                text.push('\n');
            }
            let args = match serde_json::from_str::<Value>(&call.arguments) {
                Ok(_) => call.arguments.trim().to_string(),
                Err(_) => Value::String(call.arguments.clone()).to_string(),
            };
            text.push_str(&format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": {args}}}\n</tool_call>",
                Value::String(call.name.clone())
            ));
        }
        text
    }

    /// Bytes of text the message holds (content, reasoning, tool calls).
    pub fn text_bytes(&self) -> usize {
        self.content.len()
            + self.reasoning_content.as_ref().map_or(0, String::len)
            + self
                .tool_calls
                .iter()
                .map(|c| c.name.len() + c.arguments.len())
                .sum::<usize>()
    }
}

impl Chat {
    /// A conversation without tools.
    pub fn new(messages: Vec<Message>) -> Chat {
        Chat {
            messages,
            tools: None,
        }
    }

    /// Bytes of text the conversation holds, tool definitions included.
    pub fn text_bytes(&self) -> usize {
        self.messages.iter().map(Message::text_bytes).sum::<usize>()
            + self.tools.as_ref().map_or(0, |t| t.to_string().len())
    }
}

/// A record's tool definitions: an array, or JSON text of one (as some
/// datasets store them); `null` is none.
pub fn tools_from_json(value: &Value) -> Result<Option<Value>, String> {
    let parsed;
    let tools = match value {
        Value::Null => return Ok(None),
        Value::String(s) => {
            parsed = serde_json::from_str::<Value>(s)
                .map_err(|e| format!("\"tools\" is text but not JSON ({e})"))?;
            &parsed
        }
        v => v,
    };
    match tools {
        Value::Array(a) if a.is_empty() => Ok(None),
        Value::Array(_) => Ok(Some(tools.clone())),
        _ => Err("\"tools\" is not an array of tool definitions".into()),
    }
}

/// Which fields of a message hold its author and text (`None`: `role` else
/// `from`; `content` else `value`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields<'a> {
    /// The author's field.
    pub role: Option<&'a str>,
    /// The text's field.
    pub content: Option<&'a str>,
}

/// Parses a message array; content parts go through `parts` (which pushes
/// images and returns the text). Errors name the message.
pub fn messages_from_json(
    value: &Value,
    fields: Fields<'_>,
    parts: &mut dyn FnMut(&[Value]) -> Result<String, String>,
) -> Result<Vec<Message>, String> {
    let items = value
        .as_array()
        .ok_or("messages are not a JSON array of {role, content}")?;
    items
        .iter()
        .enumerate()
        .map(|(i, m)| message(m, fields, parts).map_err(|e| format!("message {}: {e}", i + 1)))
        .collect()
}

fn message(
    m: &Value,
    fields: Fields<'_>,
    parts: &mut dyn FnMut(&[Value]) -> Result<String, String>,
) -> Result<Message, String> {
    let pick = |given: Option<&str>, a: &'static str, b: &'static str| match given {
        Some(f) => (m.get(f), f.to_string()),
        None => match m.get(a) {
            Some(v) => (Some(v), a.to_string()),
            None => (m.get(b), format!("{a}\" or \"{b}")),
        },
    };
    let (role, role_key) = pick(fields.role, "role", "from");
    let role = role
        .and_then(Value::as_str)
        .ok_or_else(|| format!("lacks a string \"{role_key}\""))?;
    let role = Role::parse(role)?;
    let (content, content_key) = pick(fields.content, "content", "value");
    let text = match content {
        Some(Value::String(c)) => c.clone(),
        Some(Value::Array(p)) => parts(p)?,
        Some(Value::Null) | None => String::new(),
        Some(_) => {
            return Err(format!(
                "\"{content_key}\" is not a string or content parts"
            ))
        }
    };
    let calls = tool_calls(m)?;
    if calls.is_empty() && matches!(content, Some(Value::Null) | None) {
        return Err(format!(
            "lacks a string \"{content_key}\" (null only with tool_calls)"
        ));
    }
    if !calls.is_empty() && role != Role::Assistant {
        return Err(format!(
            "tool_calls on a {} message (only the assistant calls tools)",
            role.as_str()
        ));
    }
    let text_field = |k: &str| -> Result<Option<String>, String> {
        match m.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("\"{k}\" is not a string")),
        }
    };
    Ok(Message {
        role,
        content: text,
        reasoning_content: text_field("reasoning_content")?,
        name: text_field("name")?,
        tool_call_id: text_field("tool_call_id")?,
        tool_calls: calls,
    })
}

/// A message's tool calls (`tool_calls: [{id, function: {name,
/// arguments}}]`, or the older `function_call: {name, arguments}`).
fn tool_calls(m: &Value) -> Result<Vec<ToolCall>, String> {
    let calls: Vec<&Value> = match (m.get("tool_calls"), m.get("function_call")) {
        (Some(Value::Array(c)), _) => c.iter().collect(),
        (Some(Value::Null) | None, Some(Value::Null) | None) => Vec::new(),
        (Some(Value::Null) | None, Some(f)) => vec![f],
        (Some(_), _) => return Err("\"tool_calls\" is not an array".into()),
    };
    calls
        .into_iter()
        .enumerate()
        .map(|(j, c)| {
            let f = c.get("function").unwrap_or(c);
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("tool call {}: lacks a string function \"name\"", j + 1))?;
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => "{}".into(),
            };
            let id = match c.get("id") {
                Some(Value::String(s)) => Some(s.clone()),
                _ => None,
            };
            Ok(ToolCall {
                name: name.to_string(),
                arguments,
                id,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<Vec<Message>, String> {
        messages_from_json(&v, Fields::default(), &mut |_| Ok("parts".into()))
    }

    #[test]
    fn openai_tool_calls_developer_and_tool_turns() {
        let m = parse(serde_json::json!([
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"},
            {"role": "assistant", "content": "18C."}
        ]))
        .unwrap();
        assert_eq!(m[0].role, Role::Developer);
        assert_eq!(m[0].role.template_name(), "system");
        assert_eq!(m[2].content, "");
        assert_eq!(m[2].tool_calls[0].id.as_deref(), Some("c1"));
        assert_eq!(
            m[2].legacy_content(),
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
        );
        assert_eq!(m[3].role, Role::Tool);
        assert_eq!(m[4].content, "18C.");
    }

    #[test]
    fn sharegpt_and_mapped_fields() {
        let m = parse(serde_json::json!([
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "hello"}
        ]))
        .unwrap();
        assert_eq!(
            (m[0].role, m[1].role, m[1].content.as_str()),
            (Role::User, Role::Assistant, "hello")
        );
        let fields = Fields {
            role: Some("speaker"),
            content: Some("text"),
        };
        let v = serde_json::json!([{"speaker": "user", "text": "x"}]);
        let m = messages_from_json(&v, fields, &mut |_| unreachable!()).unwrap();
        assert_eq!(m[0].content, "x");
        let e = messages_from_json(
            &serde_json::json!([{"role": "user"}]),
            fields,
            &mut |_| unreachable!(),
        )
        .unwrap_err();
        assert!(e.contains("message 1: lacks a string \"speaker\""), "{e}");
    }

    #[test]
    fn bad_messages_are_refused_with_their_number() {
        let e = parse(serde_json::json!([{"role": "user", "content": "a"}, {"role": "user", "content": null}])).unwrap_err();
        assert!(
            e.starts_with("message 2: lacks a string \"content\""),
            "{e}"
        );
        let e = parse(serde_json::json!([{"role": "narrator", "content": "a"}])).unwrap_err();
        assert!(e.contains("unknown chat role \"narrator\""), "{e}");
        let e = parse(serde_json::json!([{"role": "user", "content": "a", "tool_calls": [{"function": {"name": "f"}}]}])).unwrap_err();
        assert!(e.contains("only the assistant calls tools"), "{e}");
        let e = parse(serde_json::json!([{"role": "assistant", "content": null, "tool_calls": [{"function": {}}]}])).unwrap_err();
        assert!(
            e.contains("tool call 1: lacks a string function \"name\""),
            "{e}"
        );
    }
}
