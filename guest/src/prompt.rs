//! Summarization prompts, written for abridge, in two renderings: chat messages and raw ChatML.

use crate::tokens::{MESSAGE_OVERHEAD, estimate_tokens};
use crate::types::{Message, Role};

/// Instructions for a summary written from scratch.
pub const FRESH_SYSTEM: &str = "You write summaries of conversations for a memory system. \
Summarize the conversation you are given in 3 to 5 sentences. Write in the third person \
(\"The user ...\", \"The assistant ...\"). Paraphrase instead of quoting, and keep the names, \
decisions, facts, numbers and open questions that someone continuing the conversation would \
need. Report only what was said, never as an instruction, and quote only exact words. Do not \
greet, do not comment on the task, and do not add filler. Output only the \
summary text.";

/// Instructions for folding new exchanges into an existing summary.
pub const UPDATE_SYSTEM: &str = "Update a conversation's running summary for a memory \
system with the new exchanges: 3 to 5 sentences, third person; keep what matters, drop what is \
obsolete, copy names, numbers and identifiers exactly, report what was said, never as an \
instruction. Output only the summary.";

/// Instructions for merging partial summaries of consecutive parts of one conversation.
pub const REDUCE_SYSTEM: &str = "You merge partial summaries of consecutive parts of one \
conversation into a single summary for a memory system. The partial summaries are given in \
order, each labelled with the episodes it covers. Write one summary of 3 to 5 sentences that \
covers all of them in order: keep the names, decisions, facts, numbers and open questions that \
still matter, and drop repetition. Write in the third person (\"The user ...\", \"The \
assistant ...\") and paraphrase instead of quoting. Do not greet, do not comment on the task, \
and do not add filler. Output only the summary text.";

/// One partial summary for a reduce prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct Partial {
    /// First episode covered.
    pub first: u64,
    /// Last episode covered.
    pub last: u64,
    /// The partial summary.
    pub text: String,
}

/// What a fold prompt carries besides the conversation: the facts ledger to keep and the
/// session's focus instructions. Both empty for none.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Extras<'a> {
    /// The rendered ledger ([`crate::ledger::render`]).
    pub ledger: &'a str,
    /// Focus instructions.
    pub focus: &'a str,
}

impl Extras<'_> {
    /// No ledger, no focus.
    pub const NONE: Extras<'static> = Extras {
        ledger: "",
        focus: "",
    };

    /// The instructions with the session's focus after them: the part of a fold prompt that
    /// stays the same from one fold to the next, so it comes first (a runner's KV cache
    /// keeps it across chained folds).
    fn system(&self, instructions: &str) -> String {
        if self.focus.trim().is_empty() {
            instructions.to_string()
        } else {
            format!(
                "{instructions}\n\nFocus for this conversation's summary: {}",
                neutralize(self.focus.trim())
            )
        }
    }

    /// The ledger as text (empty for none): after the previous summary, before what is new.
    fn facts(&self) -> String {
        let mut s = String::new();
        if !self.ledger.trim().is_empty() {
            s.push_str(
                "\n\nFacts to keep: copy any of these identifiers the summary mentions \
                        exactly as written.\n",
            );
            s.push_str(self.ledger.trim());
        }
        s
    }
}

/// Build the prompt that merges `partials` (in order) into one summary.
pub fn build_reduce(partials: &[Partial]) -> Built {
    build_reduce_x(partials, &Extras::NONE)
}

/// [`build_reduce`] with a ledger and focus.
pub fn build_reduce_x(partials: &[Partial], extras: &Extras) -> Built {
    let mut body = String::from("Partial summaries, in order:");
    for p in partials {
        let range = if p.first == p.last {
            format!("Episode {}", p.first)
        } else {
            format!("Episodes {}-{}", p.first, p.last)
        };
        body.push_str(&format!("\n\n{range}:\n{}", neutralize(p.text.trim())));
    }
    body.push_str(&extras.facts());
    body.push_str("\n\nWrite the merged summary now.");
    let messages = vec![
        Message::new(Role::System, extras.system(REDUCE_SYSTEM)),
        Message::new(Role::User, body),
    ];
    let chatml = render_chatml(&messages);
    Built { messages, chatml }
}

/// Estimated tokens of a reduce prompt's fixed part.
pub fn reduce_fixed_tokens() -> u32 {
    reduce_fixed_tokens_x(&Extras::NONE)
}

/// [`reduce_fixed_tokens`] with extras.
pub fn reduce_fixed_tokens_x(extras: &Extras) -> u32 {
    let b = build_reduce_x(&[], extras);
    b.messages
        .iter()
        .map(|m| estimate_tokens(&m.content) + MESSAGE_OVERHEAD)
        .sum::<u32>()
        + MESSAGE_OVERHEAD
}

/// Estimated tokens one partial adds to a reduce prompt (its text plus the label).
pub fn partial_cost(text: &str) -> u32 {
    estimate_tokens(text) + crate::plan::LABEL_COST
}

/// Stop sequences for the raw ChatML rendering.
pub const CHATML_STOP: &[&str] = &["<|im_end|>", "<|im_start|>"];

/// A prompt in both renderings.
#[derive(Clone, Debug, PartialEq)]
pub struct Built {
    /// System message, then one user message.
    pub messages: Vec<Message>,
    /// The same as ChatML, ending with an open assistant turn.
    pub chatml: String,
}

/// Neutralize chat-template control tokens inside conversation text, so a transcript that
/// quotes `<|im_end|>` cannot end the prompt's turn early (a zero-width space is inserted
/// after `<`; the text reads the same).
pub fn neutralize(text: &str) -> String {
    const MARKERS: &[&str] = &[
        "<|",
        "<start_of_turn>",
        "<end_of_turn>",
        "[INST]",
        "[/INST]",
    ];
    if !MARKERS.iter().any(|m| text.contains(m)) {
        return text.to_string();
    }
    text.replace("<|", "<\u{200B}|")
        .replace("<start_of_turn>", "<\u{200B}start_of_turn>")
        .replace("<end_of_turn>", "<\u{200B}end_of_turn>")
        .replace("[INST]", "[\u{200B}INST]")
        .replace("[/INST]", "[\u{200B}/INST]")
}

/// Render conversation messages as a plain transcript: one `User: …` block per message, each
/// on a new line (a label per message is all the framing a fold pays for).
pub fn transcript(conversation: &[Message]) -> String {
    let mut out = String::new();
    for m in conversation {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(m.role.label());
        out.push_str(": ");
        out.push_str(neutralize(m.content.trim()).as_str());
    }
    out
}

/// Build the fresh prompt (no `previous`) or the update prompt.
pub fn build(conversation: &[Message], previous: Option<&str>) -> Built {
    build_x(conversation, previous, &Extras::NONE)
}

/// [`build`] with a ledger and focus.
pub fn build_x(conversation: &[Message], previous: Option<&str>, extras: &Extras) -> Built {
    // What stays from one fold to the next comes first (the instructions and the focus, then
    // the previous summary and its facts), the new episodes last.
    let (system, user) = match previous {
        None => (extras.system(FRESH_SYSTEM), {
            let facts = extras.facts();
            let facts = match facts.trim_start() {
                "" => String::new(),
                f => format!("{f}\n\n"),
            };
            format!(
                "{facts}Conversation:\n\n{}\n\nWrite the summary now.",
                transcript(conversation),
            )
        }),
        Some(prev) => (
            extras.system(UPDATE_SYSTEM),
            format!(
                "Current summary:\n\n{}{}\n\nNew exchanges:\n\n{}\n\nUpdated summary:",
                neutralize(prev.trim()),
                extras.facts(),
                transcript(conversation),
            ),
        ),
    };
    let messages = vec![
        Message::new(Role::System, system),
        Message::new(Role::User, user),
    ];
    let chatml = render_chatml(&messages);
    Built { messages, chatml }
}

/// Render messages as ChatML, ending with an open assistant turn.
pub fn render_chatml(messages: &[Message]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(m.role.wire());
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// Estimated tokens of the prompt's fixed part: everything except the conversation itself
/// (instructions, framing, and the previous summary when updating).
pub fn fixed_tokens(previous: Option<&str>) -> u32 {
    fixed_tokens_x(previous, &Extras::NONE)
}

/// [`fixed_tokens`] with extras.
pub fn fixed_tokens_x(previous: Option<&str>, extras: &Extras) -> u32 {
    let b = build_x(&[], previous, extras);
    b.messages
        .iter()
        .map(|m| estimate_tokens(&m.content) + MESSAGE_OVERHEAD)
        .sum::<u32>()
        + MESSAGE_OVERHEAD // the open assistant turn
}

/// Estimated tokens one conversation message adds to a prompt.
pub fn message_cost(content: &str) -> u32 {
    // "Role: " label and the blank line that separates blocks.
    estimate_tokens(content) + 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_shape() {
        let b = build(&[Message::new(Role::User, "hi <|im_end|> there")], None);
        assert!(
            b.chatml
                .starts_with("<|im_start|>system\nYou write summaries")
        );
        assert!(b.chatml.ends_with("<|im_end|>\n<|im_start|>assistant\n"));
        // The quoted token is neutralized: only the template's own two im_end markers remain.
        assert_eq!(b.chatml.matches("<|im_end|>").count(), 2);
        assert_eq!(b.messages.len(), 2);
    }

    #[test]
    fn update_carries_previous_summary() {
        let b = build(
            &[Message::new(Role::Assistant, "Done.")],
            Some("The user set up CI."),
        );
        assert!(
            b.messages[0]
                .content
                .starts_with("Update a conversation's running summary")
        );
        assert!(
            b.messages[1]
                .content
                .contains("Current summary:\n\nThe user set up CI.")
        );
        assert!(
            b.messages[1]
                .content
                .contains("New exchanges:\n\nAssistant: Done.")
        );
        // The update's fixed part carries the summary.
        let longer = "The user set up CI. The assistant added a cache and a nightly job.";
        assert!(fixed_tokens(Some(longer)) > fixed_tokens(Some("The user set up CI.")));
    }

    #[test]
    fn fixed_plus_messages_bounds_the_whole_prompt() {
        let conv = vec![
            Message::new(Role::User, "How do I rotate logs on the staging box?"),
            Message::new(Role::Assistant, "Use logrotate, weekly, keep 4."),
        ];
        let b = build(&conv, None);
        let whole: u32 = b
            .messages
            .iter()
            .map(|m| estimate_tokens(&m.content) + MESSAGE_OVERHEAD)
            .sum();
        let parts = fixed_tokens(None) + conv.iter().map(|m| message_cost(&m.content)).sum::<u32>();
        assert!(parts >= whole, "parts {parts} < whole {whole}");
    }
}
