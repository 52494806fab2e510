//! Claude Code session JSONL: user and assistant lines, tool calls and their results.

#[allow(unused_imports)]
use super::*;

/// One Claude Code line: the episodes it completes. An assistant line extends the held
/// assistant episode when both belong to one API response (the same message id); the held
/// episode is released when another turn starts.
pub(super) fn claude_code_line(
    st: &mut LineState,
    v: &Value,
    include_tools: bool,
    emitted: u64,
) -> Vec<ParsedEpisode> {
    let mut out = Vec::new();
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    if kind == "summary" {
        if st.title.is_none() {
            st.title = v.get("summary").and_then(Value::as_str).map(str::to_string);
            st.meta_dirty |= st.title.is_some();
        }
        return out;
    }
    if !matches!(kind, "user" | "assistant") {
        return out;
    }
    let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
    if flag("isMeta") || flag("isSidechain") || flag("isCompactSummary") {
        return out;
    }
    let Some(msg) = v.get("message") else {
        return out;
    };
    if st.id.is_none() {
        st.id = v
            .get("sessionId")
            .and_then(Value::as_str)
            .map(str::to_string);
        st.meta_dirty |= st.id.is_some();
    }
    let uuid = v
        .get("uuid")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let ts = timestamp_value(v.get("timestamp"));
    let role = if msg.get("role").and_then(Value::as_str) == Some("assistant") {
        Role::Assistant
    } else {
        Role::User
    };
    let mut texts = Vec::new();
    let mut tool_results = Vec::new();
    // Tool calls and failed results as digest lines (see `crate::digest`), in order.
    let mut actions: Vec<String> = Vec::new();
    match msg.get("content") {
        Some(Value::String(s)) => texts.push(s.clone()),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        texts.extend(b.get("text").and_then(Value::as_str).map(str::to_string))
                    }
                    Some("tool_use") => {
                        let name = b.get("name").and_then(Value::as_str).unwrap_or("tool");
                        let line = claude_code_action(name, b.get("input"));
                        if let Some(id) = b.get("id").and_then(Value::as_str) {
                            if st.calls.len() >= MAX_OPEN_CALLS
                                && let Some(k) = st.calls.keys().next().cloned()
                            {
                                st.calls.remove(&k);
                            }
                            st.calls.insert(id.to_string(), line.clone());
                        }
                        actions.push(line);
                    }
                    Some("tool_result") => {
                        let c = content_text(b.get("content"));
                        if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                            let call = b
                                .get("tool_use_id")
                                .and_then(Value::as_str)
                                .and_then(|id| st.calls.get(id))
                                .map_or("a tool call", String::as_str);
                            actions.push(crate::digest::failure_line(call, &c));
                        }
                        if include_tools && !c.trim().is_empty() {
                            tool_results.push(c);
                        }
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    let text = if role == Role::User {
        strip_harness(&texts.join("\n"))
    } else {
        texts.join("\n").trim().to_string()
    };
    let mut count = emitted + u64::from(st.held.is_some());
    for (k, r) in tool_results.into_iter().enumerate() {
        st.open_turn = None;
        out.extend(st.held.take());
        out.push(ParsedEpisode {
            item: None,
            role: Role::Tool,
            content: r,
            timestamp_ms: ts,
            source_key: format!("{uuid}#tool{k}"),
            speaker: None,
        });
        count += 1;
    }
    if !actions.is_empty() {
        // Text before the calls is its own episode; the calls follow it, in order.
        if !text.is_empty() {
            out.extend(st.held.take());
            let source_key = if uuid.is_empty() {
                position_key(count, role, &text)
            } else {
                uuid.clone()
            };
            out.push(ParsedEpisode {
                item: None,
                role,
                content: text,
                timestamp_ms: ts,
                source_key,
                speaker: None,
            });
            count += 1;
        }
        st.open_turn = None;
        out.extend(st.held.take());
        for (k, a) in actions.into_iter().enumerate() {
            let source_key = if uuid.is_empty() {
                position_key(count, Role::Tool, &a)
            } else {
                format!("{uuid}#act{k}")
            };
            out.push(ParsedEpisode {
                item: None,
                role: Role::Tool,
                content: a,
                timestamp_ms: ts,
                source_key,
                speaker: None,
            });
            count += 1;
        }
        return out;
    }
    if text.is_empty() {
        return out;
    }
    let msg_id = msg.get("id").and_then(Value::as_str).map(str::to_string);
    // One API response arrives as several assistant lines sharing a message id.
    if role == Role::Assistant
        && msg_id.is_some()
        && st.open_turn == msg_id
        && let Some(last) = st.held.as_mut()
    {
        last.content.push('\n');
        last.content.push_str(&text);
        return out;
    }
    out.extend(st.held.take());
    let source_key = if uuid.is_empty() {
        position_key(count, role, &text)
    } else {
        uuid
    };
    let ep = ParsedEpisode {
        item: None,
        role,
        content: text,
        timestamp_ms: ts,
        source_key,
        speaker: None,
    };
    if role == Role::Assistant && msg_id.is_some() {
        st.open_turn = msg_id;
        st.held = Some(ep);
    } else {
        st.open_turn = None;
        out.push(ep);
    }
    out
}

/// Tool calls remembered per conversation to name a failed result's call.
pub(super) const MAX_OPEN_CALLS: usize = 256;

/// A Claude Code tool call as a digest action line: the file a file tool touched, the command
/// a shell ran, the to-do list a `TodoWrite` set, the pattern, URL or query of the others.
pub(super) fn claude_code_action(name: &str, input: Option<&Value>) -> String {
    let field = |k: &str| input.and_then(|i| i.get(k)).and_then(Value::as_str);
    if name == "TodoWrite" {
        let items: Vec<String> = input
            .and_then(|i| i.get("todos"))
            .and_then(Value::as_array)
            .map(|todos| {
                todos
                    .iter()
                    .filter_map(|t| {
                        let content = t.get("content").and_then(Value::as_str)?;
                        let status = t.get("status").and_then(Value::as_str).unwrap_or("pending");
                        Some(format!("[{status}] {}", content.replace("; ", ", ")))
                    })
                    .collect()
            })
            .unwrap_or_default();
        return crate::digest::action_line(name, Some(&items.join("; ")));
    }
    let arg = field("file_path")
        .or_else(|| field("notebook_path"))
        .or_else(|| field("command"))
        .or_else(|| field("pattern"))
        .or_else(|| field("url"))
        .or_else(|| field("query"))
        .or_else(|| field("path"))
        .or_else(|| field("description"));
    crate::digest::action_line(name, arg)
}
