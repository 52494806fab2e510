//! OpenAI-style messages: `{"role", "content", "name"?, "created_at"?}`.

#[allow(unused_imports)]
use super::*;

/// One OpenAI message at position `i`, if it carries text.
pub(super) fn openai_message(
    opts: &Options,
    i: u32,
    m: &Value,
) -> Result<Option<ParsedEpisode>, ParseError> {
    let Some(role_s) = m.get("role").and_then(Value::as_str) else {
        return Err(malformed(1, format!("message {i} has no \"role\"")));
    };
    let Some(role) = parse_role(role_s) else {
        return Err(malformed(
            1,
            format!("message {i} has unknown role '{role_s}'"),
        ));
    };
    let mut content = content_text(m.get("content"));
    if opts.include_tools {
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            for c in calls {
                let name = c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .unwrap_or("tool");
                let args = c
                    .pointer("/function/arguments")
                    .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_string))
                    .unwrap_or_default();
                content.push_str(&format!("\n[tool call {name}: {args}]"));
            }
        }
    } else if role == Role::Tool {
        return Ok(None);
    }
    let content = content.trim().to_string();
    if content.is_empty() {
        return Ok(None);
    }
    let source_key = position_key(u64::from(i), role, &content);
    Ok(Some(ParsedEpisode {
        item: None,
        role,
        content,
        timestamp_ms: message_time(m),
        source_key,
        speaker: speaker_name(m.get("name")),
    }))
}
