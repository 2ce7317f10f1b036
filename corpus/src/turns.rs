//! Where a chat document's assistant turns start, in its tokens: the
//! generation check (`measure::eval::prompts`) ends a chat prompt there, so
//! that what the models generate is an assistant's answer.
//!
//! For each user turn followed by an assistant turn, the conversation up
//! to that user turn is rendered with the template's generation prompt
//! ([`Tokenizer::apply_chat_template_prompt`]) and tokenized as the whole
//! conversation was; when those tokens are a prefix of the document's
//! tokens (a template that renders history differently from a prompt, or
//! a token merged across the boundary, is not), their count is an
//! assistant-turn start. Only starts within `limit` tokens are recorded:
//! a prompt must fit the context with its continuation.

use super::chat::{Chat, ChatKwargs, Role};
use super::tokenizer::Tokenizer;

/// Token offsets in `tokens` (the rendered `chat`, tokenized with special
/// tokens) where an assistant turn's content starts, ascending, each at
/// most `limit`. `eos`: the end token the tokenizer appends to every text,
/// if it appends one (left off a prefix before comparing).
pub fn assistant_starts(
    tokenizer: &dyn Tokenizer,
    chat: &Chat,
    kwargs: &ChatKwargs,
    tokens: &[i32],
    limit: usize,
    eos: Option<i32>,
) -> Vec<u32> {
    let mut starts = Vec::new();
    let messages = &chat.messages;
    for i in 0..messages.len().saturating_sub(1) {
        if (messages[i].role, messages[i + 1].role) != (Role::User, Role::Assistant) {
            continue;
        }
        let prefix = Chat {
            messages: messages[..=i].to_vec(),
            tools: chat.tools.clone(),
        };
        // A template that refuses a conversation ending in a user turn
        // gives no start there.
        let Ok(text) = tokenizer.apply_chat_template_prompt(&prefix, kwargs) else {
            continue;
        };
        let mut ids = tokenizer.tokenize(&text, true);
        if eos.is_some() && ids.last().copied() == eos {
            ids.pop();
        }
        if ids.len() > limit {
            break;
        }
        if !ids.is_empty() && ids.len() < tokens.len() && tokens.starts_with(&ids) {
            starts.push(ids.len() as u32);
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::assistant_starts;
    use crate::chat::{Chat, ChatKwargs, Message, Role};
    use crate::tokenizer::{ByteTokenizer, Tokenizer};

    #[test]
    fn starts_follow_each_user_turn_answered_by_the_assistant() {
        let chat = Chat::new(vec![
            Message::text(Role::System, "be brief"),
            Message::text(Role::User, "hi"),
            Message::text(Role::Assistant, "hello"),
            Message::text(Role::User, "why"),
            Message::text(Role::Assistant, "because"),
            Message::text(Role::User, "ok"),
        ]);
        let kwargs = ChatKwargs::new();
        let text = ByteTokenizer.apply_chat_template(&chat, &kwargs).unwrap();
        let tokens = ByteTokenizer.tokenize(&text, true);
        let starts = assistant_starts(&ByteTokenizer, &chat, &kwargs, &tokens, 1000, None);
        // "<system>be brief\n<user>hi\n<assistant>" is 37 bytes; the second
        // adds "hello\n<user>why\n<assistant>" (27); the last user turn has
        // no answer.
        assert_eq!(starts, [37, 64]);
        for &s in &starts {
            assert!(text[..s as usize].ends_with("<assistant>"));
        }
        assert_eq!(
            assistant_starts(&ByteTokenizer, &chat, &kwargs, &tokens, 40, None),
            [37]
        );
    }
}
