//! Chat records: roles and messages, as sources read them and the model's
//! chat template takes them.

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
