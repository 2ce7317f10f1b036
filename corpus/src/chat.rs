//! Chat records: roles and messages, as sources read them and the model's
//! chat template takes them. Messages come in OpenAI's form (`{role,
//! content}`, an assistant turn's `tool_calls` with `content: null`, the
//! `developer` and `tool` roles, content parts) or ShareGPT's (`{from,
//! value}`), or through a field mapping (`role_field`, `content_field`).
//!
//! The chat template path (llama.cpp's `llama_chat_apply_template`) takes
//! each message as a role and a text only, so two things are rendered here,
//! before the template sees them:
//! - an assistant turn's tool calls are appended to its content, one block
//!   each, as Qwen's and Hermes' templates write them:
//!   `<tool_call>\n{"name": NAME, "arguments": ARGS}\n</tool_call>` (ARGS
//!   as the record gives them: the JSON text of an OpenAI `arguments`
//!   string, else the JSON value);
//! - the `developer` role goes to the template as `system`, the role the
//!   built-in templates know for instructions.
//!
//! A tool's answer keeps the `tool` role, which the built-in templates
//! render as their own turn. Models whose Jinja template renders tools
//! differently see these tokens, not their server's.

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
    /// What they wrote (an assistant turn's tool calls rendered in).
    pub content: String,
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
    let mut text = match content {
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
    for call in calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&call);
    }
    Ok(Message {
        role,
        content: text,
    })
}

/// A message's tool calls (`tool_calls: [{function: {name, arguments}}]`,
/// or the older `function_call: {name, arguments}`), each rendered as a
/// `<tool_call>` block.
fn tool_calls(m: &Value) -> Result<Vec<String>, String> {
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
            let args = match f.get("arguments") {
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(_) => s.trim().to_string(),
                    Err(_) => Value::String(s.clone()).to_string(),
                },
                Some(v) => v.to_string(),
                None => "{}".into(),
            };
            Ok(format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": {args}}}\n</tool_call>",
                Value::String(name.into())
            ))
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
        assert_eq!(
            m[2].content,
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
