//! Chat records: roles, and rendering a conversation to the text the model
//! saw in training (through the model's own chat template).

use super::source::Content;
use super::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

/// A message author. Only roles every chat template knows are accepted, so a
/// typo is an error rather than a silently odd prompt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// System prompt.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's answer.
    Tool,
}

impl Role {
    /// Parses a role name.
    pub fn parse(s: &str) -> Result<Role, String> {
        match s {
            "system" => Ok(Role::System),
            "user" => Ok(Role::User),
            "assistant" => Ok(Role::Assistant),
            "tool" => Ok(Role::Tool),
            other => Err(format!(
                "unknown chat role {other:?} (expected system, user, assistant or tool)"
            )),
        }
    }

    /// The name chat templates expect.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What they wrote.
    pub content: String,
}

/// Text to tokenize for a record, and whether special-token text in it is
/// parsed as special tokens (only for templated chat: the template's markers
/// must become control tokens, while plain text that happens to contain
/// `<|im_end|>` must not).
pub fn render(tokenizer: &dyn Tokenizer, content: &Content) -> Result<(String, bool), String> {
    match content {
        Content::Text(t) => Ok((t.clone(), false)),
        Content::Chat(messages) => Ok((tokenizer.apply_chat_template(messages)?, true)),
    }
}
