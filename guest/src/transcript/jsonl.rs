//! JSON lines: one `{"role", "content", ...}` object per line.

#[allow(unused_imports)]
use super::*;

/// One JSON-lines episode from line `n`; `Ok(None)` for lines with no text (or tool lines
/// when tools are excluded); `Err` says what is wrong with the line.
pub(super) fn jsonl_episode(
    n: u32,
    v: &Value,
    include_tools: bool,
) -> Result<Option<ParsedEpisode>, String> {
    let Some(role_s) = v.get("role").and_then(Value::as_str) else {
        let hint = if line_format(v) == Some(Format::ClaudeCode) {
            " (this looks like a Claude Code file: pass --format claude-code)"
        } else {
            ""
        };
        return Err(format!(
            "expected {{\"role\", \"content\"}} but found no \"role\"{hint}"
        ));
    };
    let role = parse_role(role_s)
        .ok_or_else(|| format!("unknown role '{role_s}'; use system, user, assistant or tool"))?;
    if role == Role::Tool && !include_tools {
        return Ok(None);
    }
    let Some(raw) = v.get("content") else {
        let hint = if v.get("text").is_some() {
            " (it has \"text\": name that field \"content\")"
        } else {
            ""
        };
        return Err(format!(
            "a message needs \"content\" beside \"role\"{hint}, e.g. {{\"role\": \"user\", \"content\": \"Book the room for Thursday\"}}"
        ));
    };
    let content = content_text(Some(raw));
    if content.trim().is_empty() {
        return Ok(None);
    }
    let source_key = match v.get("id") {
        Some(Value::String(s)) => format!("id:{s}"),
        Some(Value::Number(x)) => format!("id:{x}"),
        _ => position_key(u64::from(n), role, &content),
    };
    let item = match v.get("item") {
        None | Some(Value::Null) => None,
        Some(it) => {
            let text = it.to_string();
            if text.len() > MAX_ITEM_BYTES {
                return Err(format!(
                    "the message's \"item\" is {} bytes of JSON; at most {MAX_ITEM_BYTES} are kept: store a smaller record (or none) with it",
                    text.len()
                ));
            }
            Some(text)
        }
    };
    Ok(Some(ParsedEpisode {
        role,
        content,
        timestamp_ms: message_time(v),
        source_key,
        speaker: speaker_name(v.get("name")),
        item,
    }))
}
