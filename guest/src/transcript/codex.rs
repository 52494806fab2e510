//! Codex CLI rollout JSONL: `{"timestamp", "type", "payload"}` lines.

#[allow(unused_imports)]
use super::*;

/// One Codex rollout line: the episodes it adds. The user's typed prompt comes from
/// `event_msg` `user_message` (the `response_item` user messages also carry injected
/// context); the assistant's text from `response_item` `message` (its `event_msg`
/// `agent_message` twin is skipped); tool calls (`function_call`, `custom_tool_call`,
/// `local_shell_call`) become digest action lines and failed outputs failure lines, paired by
/// `call_id`. Codex's own compaction summaries, reasoning and token counts are left out.
pub(super) fn codex_line(
    st: &mut LineState,
    v: &Value,
    include_tools: bool,
    line: u32,
) -> Vec<ParsedEpisode> {
    let mut out = Vec::new();
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    let Some(p) = v.get("payload") else {
        return out;
    };
    let ts = timestamp_value(v.get("timestamp"));
    let ptype = p.get("type").and_then(Value::as_str).unwrap_or("");
    // Items without an id of their own are keyed by the file's line number and a content
    // hash (the same in every chunking and across `watch` restarts).
    let n = u64::from(line);
    let key = |tag: &str, role: Role, text: &str| -> String {
        match p.get("call_id").and_then(Value::as_str) {
            Some(id) => format!("{id}#{tag}"),
            None => position_key(n, role, text),
        }
    };
    let push = |out: &mut Vec<ParsedEpisode>, role: Role, content: String, source_key: String| {
        out.push(ParsedEpisode {
            item: None,
            role,
            content,
            timestamp_ms: ts,
            source_key,
            speaker: None,
        });
    };
    match (kind, ptype) {
        ("session_meta", _) if st.id.is_none() => {
            st.id = p
                .get("id")
                .or_else(|| p.get("session_id"))
                .and_then(Value::as_str)
                .map(str::to_string);
            st.meta_dirty |= st.id.is_some();
        }
        ("event_msg", "user_message") => {
            let text = p
                .get("message")
                .and_then(Value::as_str)
                .map(strip_harness)
                .unwrap_or_default();
            if !text.trim().is_empty() {
                let k = position_key(n, Role::User, &text);
                push(&mut out, Role::User, text, k);
            }
        }
        ("response_item", "message")
            if p.get("role").and_then(Value::as_str) == Some("assistant") =>
        {
            let text: Vec<String> = p
                .get("content")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|b| b.get("type").and_then(Value::as_str) == Some("output_text"))
                .filter_map(|b| b.get("text").and_then(Value::as_str).map(str::to_string))
                .collect();
            let text = text.join("\n").trim().to_string();
            if !text.is_empty() {
                let k = match p.get("id").and_then(Value::as_str) {
                    Some(id) => id.to_string(),
                    None => position_key(n, Role::Assistant, &text),
                };
                push(&mut out, Role::Assistant, text, k);
            }
        }
        ("response_item", "function_call" | "custom_tool_call" | "local_shell_call") => {
            let name =
                p.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(if ptype == "local_shell_call" {
                        "shell"
                    } else {
                        "tool"
                    });
            let lines = codex_actions(name, p);
            if let (Some(id), Some(first)) =
                (p.get("call_id").and_then(Value::as_str), lines.first())
            {
                if st.calls.len() >= MAX_OPEN_CALLS
                    && let Some(k) = st.calls.keys().next().cloned()
                {
                    st.calls.remove(&k);
                }
                st.calls.insert(id.to_string(), first.clone());
            }
            for (i, line) in lines.into_iter().enumerate() {
                let k = key(&format!("act{i}"), Role::Tool, &line);
                push(&mut out, Role::Tool, line, k);
            }
        }
        ("response_item", "function_call_output" | "custom_tool_call_output") => {
            let output = codex_output(p.get("output"));
            if let Some((code, text)) = codex_failure(&output) {
                let call = p
                    .get("call_id")
                    .and_then(Value::as_str)
                    .and_then(|id| st.calls.get(id))
                    .map_or("a tool call", String::as_str)
                    .to_string();
                let line = crate::digest::failure_line(
                    &call,
                    &format!("exit code {code}: {}", crate::digest::error_line(&text)),
                );
                let k = key("fail", Role::Tool, &line);
                push(&mut out, Role::Tool, line, k);
            }
            if include_tools && !output.trim().is_empty() {
                let k = key("out", Role::Tool, &output);
                push(&mut out, Role::Tool, output, k);
            }
        }
        _ => {}
    }
    out
}

/// A Codex tool call's action lines: a shell command as `shell: CMD`, an `apply_patch` as one
/// line per file it adds (`Write`), updates (`Edit`) or deletes.
pub(super) fn codex_actions(name: &str, p: &Value) -> Vec<String> {
    let args: Option<Value> = p
        .get("arguments")
        .and_then(Value::as_str)
        .and_then(|a| serde_json::from_str(a).ok());
    let input = p
        .get("input")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            args.as_ref()
                .and_then(|a| a.get("input").or_else(|| a.get("patch")))
                .and_then(Value::as_str)
                .map(str::to_string)
        });
    if name == "apply_patch" {
        let patch = input.unwrap_or_default();
        let mut lines = Vec::new();
        for l in patch.lines() {
            let l = l.trim();
            if let Some(f) = l.strip_prefix("*** Add File: ") {
                lines.push(crate::digest::action_line("Write", Some(f.trim())));
            } else if let Some(f) = l.strip_prefix("*** Update File: ") {
                lines.push(crate::digest::action_line("Edit", Some(f.trim())));
            } else if let Some(f) = l.strip_prefix("*** Delete File: ") {
                lines.push(crate::digest::action_line("Delete", Some(f.trim())));
            }
        }
        if lines.is_empty() {
            lines.push(crate::digest::action_line("apply_patch", None));
        }
        return lines;
    }
    // A shell call: `command` is an argv array or a string (in `arguments`, or in a local
    // shell call's `action`).
    let command = args
        .as_ref()
        .and_then(|a| a.get("command").or_else(|| a.get("cmd")))
        .or_else(|| p.get("action").and_then(|a| a.get("command")))
        .map(|c| match c {
            Value::Array(argv) => {
                let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
                // `bash -lc "…"`: the script is the command.
                match words.as_slice() {
                    [sh, flag, script] if sh.ends_with("sh") && flag.starts_with('-') => {
                        script.to_string()
                    }
                    _ => words.join(" "),
                }
            }
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    match command {
        Some(c) => vec![crate::digest::action_line("shell", Some(&c))],
        None => vec![crate::digest::action_line(name, input.as_deref())],
    }
}

/// A Codex tool output as text: a string (which may itself be JSON `{"output", "metadata"}`)
/// or an array of content items.
pub(super) fn codex_output(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(other) => content_text(Some(other)),
        None => String::new(),
    }
}

/// The exit code and text of a failed Codex command output: JSON with `metadata.exit_code`,
/// or text starting with an `Exit code: N` line; `None` when it succeeded or says nothing.
pub(super) fn codex_failure(output: &str) -> Option<(i64, String)> {
    if let Ok(v) = serde_json::from_str::<Value>(output)
        && let Some(code) = v.pointer("/metadata/exit_code").and_then(Value::as_i64)
    {
        let text = v
            .get("output")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        return (code != 0).then_some((code, text));
    }
    let first = output.lines().next().unwrap_or("");
    let code: i64 = first
        .strip_prefix("Exit code: ")
        .or_else(|| first.strip_prefix("exit code: "))?
        .trim()
        .parse()
        .ok()?;
    (code != 0).then(|| (code, output.lines().skip(1).collect::<Vec<_>>().join("\n")))
}
