//! ChatGPT `conversations.json`: the active branch of each conversation's message tree.

#[allow(unused_imports)]
use super::*;

/// One ChatGPT conversation (`ci`-th in the file): the active branch, from the current node up
/// to the root, or (with no current node) following the last child from the root. Links that
/// form a cycle end the walk with a warning.
pub(super) fn chatgpt_conversation(
    opts: &Options,
    ci: u32,
    c: &Value,
) -> Result<(Conversation, Vec<String>), ParseError> {
    let mut warnings = Vec::new();
    let Some(mapping) = c.get("mapping").and_then(Value::as_object) else {
        return Err(malformed(
            1,
            format!("conversation {ci} has no \"mapping\"; is this a ChatGPT conversations.json?"),
        ));
    };
    let id = c
        .get("conversation_id")
        .or_else(|| c.get("id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let title = c.get("title").and_then(Value::as_str).map(str::to_string);
    let mut leaf = c
        .get("current_node")
        .and_then(Value::as_str)
        .map(str::to_string);
    if leaf.as_ref().is_none_or(|l| !mapping.contains_key(l)) {
        let mut node = mapping
            .iter()
            .find(|(_, n)| n.get("parent").is_none_or(Value::is_null))
            .map(|(k, _)| k.clone());
        let mut seen = BTreeSet::new();
        while let Some(k) = node.clone() {
            seen.insert(k.clone());
            let next = mapping[&k]
                .get("children")
                .and_then(Value::as_array)
                .and_then(|ch| ch.last())
                .and_then(Value::as_str);
            match next {
                Some(n) if seen.contains(n) => {
                    warnings.push(format!(
                        "{}: conversation {ci}: its children links form a cycle; read up to it",
                        opts.name
                    ));
                    break;
                }
                Some(n) if mapping.contains_key(n) => node = Some(n.to_string()),
                _ => break,
            }
        }
        leaf = node;
    }
    let mut path = Vec::new();
    let mut seen = BTreeSet::new();
    let mut cur = leaf;
    while let Some(k) = cur {
        if !seen.insert(k.clone()) {
            warnings.push(format!(
                "{}: conversation {ci}: its parent links form a cycle; read from where it closes",
                opts.name
            ));
            break;
        }
        let Some(node) = mapping.get(&k) else { break };
        path.push(node);
        cur = node
            .get("parent")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    path.reverse();
    let mut episodes: Vec<ParsedEpisode> = Vec::new();
    for node in path {
        let Some(m) = node.get("message").filter(|m| !m.is_null()) else {
            continue;
        };
        let role_s = m
            .pointer("/author/role")
            .and_then(Value::as_str)
            .unwrap_or("");
        let meta = m.get("metadata");
        let meta_flag = |k: &str| {
            meta.and_then(|x| x.get(k))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        if meta_flag("is_visually_hidden_from_conversation") {
            continue;
        }
        let role = match role_s {
            "system" if meta_flag("is_user_system_message") => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" if opts.include_tools => Role::Tool,
            _ => continue,
        };
        if role == Role::Assistant
            && m.get("recipient")
                .and_then(Value::as_str)
                .is_some_and(|r| r != "all")
            && !opts.include_tools
        {
            continue;
        }
        let ctype = m
            .pointer("/content/content_type")
            .and_then(Value::as_str)
            .unwrap_or("text");
        if !matches!(ctype, "text" | "multimodal_text") {
            continue;
        }
        let content = content_text(m.pointer("/content/parts")).trim().to_string();
        if content.is_empty() {
            continue;
        }
        let key = m.get("id").and_then(Value::as_str).map_or_else(
            || position_key(episodes.len() as u64, role, &content),
            str::to_string,
        );
        episodes.push(ParsedEpisode {
            item: None,
            role,
            content,
            timestamp_ms: timestamp_value(m.get("create_time")),
            source_key: key,
            speaker: speaker_name(m.pointer("/author/name")),
        });
    }
    Ok((
        Conversation {
            id,
            title,
            episodes,
        },
        warnings,
    ))
}
