//! `abridge setup`: installing abridge into a coding agent's configuration — Claude Code's
//! hooks (`settings.json`) and MCP server (`~/.claude.json` or `.mcp.json`), Codex's hooks
//! and MCP server (`config.toml`: `[hooks]`, which Codex reads like Claude Code's, and
//! `[mcp_servers]`). Each change is a merge: every other setting is kept, abridge's own
//! entries are recognised (a command that runs `abridge … hook` or `… mcp`) and replaced, so a
//! second run changes nothing; `remove` takes out only abridge's entries. The functions here
//! are pure (text in, text out); the front end reads, backs up and writes the files.

use serde_json::{Map, Value, json};

use super::{AppError, AppResult};

/// The Claude Code hook events abridge installs, with their matchers (`None`: every source).
pub const CLAUDE_EVENTS: [(&str, Option<&str>); 4] = [
    ("SessionStart", Some("startup|resume|clear|compact")),
    ("PreCompact", None),
    ("Stop", None),
    ("SessionEnd", None),
];

/// The Codex hook events abridge installs. Codex has no `SessionEnd`; its `Stop` ends each
/// turn, and `SessionStart` fires with the same four sources as Claude Code's.
pub const CODEX_EVENTS: [(&str, Option<&str>); 3] = [
    ("SessionStart", Some("startup|resume|clear|compact")),
    ("PreCompact", None),
    ("Stop", None),
];

/// Seconds Claude Code gives a hook command before it gives up on it (the hook keeps to its
/// own 5 s budget well within it).
const HOOK_TIMEOUT_SECS: u64 = 15;

/// `s` quoted for a POSIX shell when it needs it.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// How abridge is run from an agent: the executable and the global arguments (the database).
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The `abridge` executable, absolute.
    pub program: String,
    /// Arguments before the subcommand (`--db PATH`).
    pub global: Vec<String>,
}

impl Invocation {
    /// A shell command line running `sub` (for hook commands).
    pub fn command_line(&self, sub: &[&str]) -> String {
        let mut parts = vec![shell_quote(&self.program)];
        parts.extend(self.global.iter().map(|a| shell_quote(a)));
        parts.extend(sub.iter().map(|a| shell_quote(a)));
        parts.join(" ")
    }

    /// The arguments after the program for `sub` (for MCP server entries).
    pub fn args(&self, sub: &[&str]) -> Vec<String> {
        let mut a = self.global.clone();
        a.extend(sub.iter().map(|s| s.to_string()));
        a
    }
}

/// Whether a hook command is one abridge installed.
fn is_ours(command: &str) -> bool {
    let words: Vec<&str> = command.split_whitespace().collect();
    words
        .first()
        .is_some_and(|p| p.trim_matches('\'').ends_with("abridge"))
        && words.contains(&"hook")
}

fn parse_object(text: &str, what: &str) -> AppResult<Map<String, Value>> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(AppError::invalid(format!("{what} is not a JSON object"))),
        Err(e) => Err(AppError::invalid(format!(
            "{what} is not valid JSON ({e}); fix it or move it aside, then run setup again"
        ))),
    }
}

/// The key order of a JSON text: each object's keys as written, nested alike.
#[derive(Debug, Default)]
enum Order {
    #[default]
    Leaf,
    Object(Vec<(String, Order)>),
    Array(Vec<Order>),
}

impl<'de> serde::Deserialize<'de> for Order {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Order, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Order;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Order, A::Error> {
                let mut keys = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Order>()? {
                    keys.push((k, v));
                }
                Ok(Order::Object(keys))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<Order, A::Error> {
                let mut items = Vec::new();
                while let Some(x) = s.next_element::<Order>()? {
                    items.push(x);
                }
                Ok(Order::Array(items))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
            fn visit_unit<E>(self) -> Result<Order, E> {
                Ok(Order::Leaf)
            }
        }
        d.deserialize_any(V)
    }
}

/// `v` serialized with its objects' keys in `order` (keys the text did not have after them,
/// in their own order).
struct Ordered<'a>(&'a Value, &'a Order);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        static LEAF: Order = Order::Leaf;
        match (self.0, self.1) {
            (Value::Object(m), order) => {
                let known: &[(String, Order)] = match order {
                    Order::Object(k) => k,
                    _ => &[],
                };
                let mut out = s.serialize_map(Some(m.len()))?;
                for (k, o) in known {
                    if let Some(v) = m.get(k) {
                        out.serialize_entry(k, &Ordered(v, o))?;
                    }
                }
                for (k, v) in m {
                    if !known.iter().any(|(x, _)| x == k) {
                        out.serialize_entry(k, &Ordered(v, &LEAF))?;
                    }
                }
                out.end()
            }
            (Value::Array(items), order) => {
                let orders: &[Order] = match order {
                    Order::Array(o) => o,
                    _ => &[],
                };
                let mut out = s.serialize_seq(Some(items.len()))?;
                for (i, v) in items.iter().enumerate() {
                    out.serialize_element(&Ordered(v, orders.get(i).unwrap_or(&LEAF)))?;
                }
                out.end()
            }
            (v, _) => v.serialize(s),
        }
    }
}

/// The indentation of a JSON text: its first indented line's (two spaces when none).
fn indent_of(text: &str) -> String {
    text.lines()
        .map(|l| &l[..l.len() - l.trim_start_matches([' ', '\t']).len()])
        .find(|w| !w.is_empty())
        .unwrap_or("  ")
        .to_string()
}

/// `v` written the way the user's file `original` is: its keys in the order they were, its
/// indentation, a final newline.
fn pretty_like(v: &Map<String, Value>, original: &str) -> String {
    let order: Order = serde_json::from_str(original).unwrap_or_default();
    let indent = indent_of(original);
    let mut out = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    serde::Serialize::serialize(&Ordered(&Value::Object(v.clone()), &order), &mut ser)
        .expect("JSON serializes");
    let mut s = String::from_utf8(out).expect("JSON is UTF-8");
    s.push('\n');
    s
}

/// Claude Code's `settings.json` with abridge's hooks merged in (or, with `remove`, taken
/// out). `text` is the file as it is (empty when it does not exist).
pub fn claude_settings(text: &str, how: &Invocation, remove: bool) -> AppResult<String> {
    let mut root = parse_object(text, "the Claude Code settings file")?;
    let hooks = root
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(hooks) = hooks else {
        return Err(AppError::invalid(
            "the settings file's \"hooks\" is not an object; fix it, then run setup again",
        ));
    };
    for (event, matcher) in CLAUDE_EVENTS {
        let groups = hooks
            .entry(event)
            .or_insert_with(|| Value::Array(Vec::new()));
        let Value::Array(groups) = groups else {
            return Err(AppError::invalid(format!(
                "the settings file's hooks.{event} is not an array; fix it, then run setup again"
            )));
        };
        // Take out abridge's handlers wherever they are; drop groups left empty by it.
        groups.retain_mut(|g| {
            let Some(list) = g.get_mut("hooks").and_then(Value::as_array_mut) else {
                return true;
            };
            let before = list.len();
            list.retain(|h| {
                !h.get("command")
                    .and_then(Value::as_str)
                    .is_some_and(is_ours)
            });
            !(before > 0 && list.is_empty())
        });
        if !remove {
            let mut group = Map::new();
            if let Some(m) = matcher {
                group.insert("matcher".into(), json!(m));
            }
            group.insert(
                "hooks".into(),
                json!([{
                    "type": "command",
                    "command": how.command_line(&["hook"]),
                    "timeout": HOOK_TIMEOUT_SECS,
                }]),
            );
            groups.push(Value::Object(group));
        }
    }
    hooks.retain(|_, v| !v.as_array().is_some_and(Vec::is_empty));
    if hooks.is_empty() {
        root.remove("hooks");
    }
    Ok(pretty_like(&root, text))
}

/// An MCP configuration (`~/.claude.json`, `.mcp.json`) with abridge's server under
/// `mcpServers.abridge` (or, with `remove`, without it).
pub fn claude_mcp(text: &str, how: &Invocation, remove: bool) -> AppResult<String> {
    let mut root = parse_object(text, "the MCP configuration file")?;
    let servers = root
        .entry("mcpServers")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(servers) = servers else {
        return Err(AppError::invalid(
            "the file's \"mcpServers\" is not an object; fix it, then run setup again",
        ));
    };
    if remove {
        servers.remove("abridge");
    } else {
        servers.insert(
            "abridge".into(),
            json!({
                "type": "stdio",
                "command": how.program,
                "args": how.args(&["mcp"]),
            }),
        );
    }
    if servers.is_empty() {
        root.remove("mcpServers");
    }
    Ok(pretty_like(&root, text))
}

/// Codex's `config.toml` with abridge's hooks (`[[hooks.SessionStart]]`, …) and MCP server
/// (`[mcp_servers.abridge]`) merged in (or, with `remove`, taken out); comments, formatting
/// and every other entry — other hooks, `[hooks.state]` with the trust Codex records — are
/// kept.
pub fn codex_config(text: &str, how: &Invocation, remove: bool) -> AppResult<String> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| {
        AppError::invalid(format!(
            "the Codex configuration is not valid TOML ({e}); fix it, then run setup again"
        ))
    })?;
    codex_hooks(&mut doc, how, remove)?;
    let servers = doc.entry("mcp_servers").or_insert_with(implicit_table);
    let Some(servers) = servers.as_table_mut() else {
        return Err(AppError::invalid(
            "the Codex configuration's mcp_servers is not a table; fix it, then run setup again",
        ));
    };
    if remove {
        servers.remove("abridge");
    } else {
        let mut t = toml_edit::Table::new();
        t["command"] = toml_edit::value(how.program.clone());
        let mut args = toml_edit::Array::new();
        for a in how.args(&["mcp"]) {
            args.push(a);
        }
        t["args"] = toml_edit::value(args);
        t["startup_timeout_sec"] = toml_edit::value(20);
        servers.insert("abridge", toml_edit::Item::Table(t));
    }
    if servers.is_empty() {
        doc.remove("mcp_servers");
    }
    Ok(doc.to_string())
}

fn implicit_table() -> toml_edit::Item {
    let mut t = toml_edit::Table::new();
    t.set_implicit(true);
    toml_edit::Item::Table(t)
}

/// Take abridge's handlers out of one hook group's `hooks` list (an array of tables or an
/// inline array); whether the group held handlers and now holds none.
fn drop_ours(group: &mut dyn toml_edit::TableLike) -> bool {
    let ours = |t: &dyn toml_edit::TableLike| {
        t.get("command")
            .and_then(toml_edit::Item::as_str)
            .is_some_and(is_ours)
    };
    let (before, after) = match group.get_mut("hooks") {
        Some(toml_edit::Item::ArrayOfTables(list)) => {
            let before = list.len();
            list.retain(|t| !ours(t));
            (before, list.len())
        }
        Some(toml_edit::Item::Value(toml_edit::Value::Array(list))) => {
            let before = list.len();
            list.retain(|v| !v.as_inline_table().is_some_and(|t| ours(t)));
            (before, list.len())
        }
        _ => (0, 0),
    };
    before > 0 && after == 0
}

/// Codex's `[hooks]`: every event in [`CODEX_EVENTS`] runs `abridge … hook` once.
fn codex_hooks(doc: &mut toml_edit::DocumentMut, how: &Invocation, remove: bool) -> AppResult<()> {
    let command = how.command_line(&["hook"]);
    let hooks = doc.entry("hooks").or_insert_with(implicit_table);
    let Some(hooks) = hooks.as_table_mut() else {
        return Err(AppError::invalid(
            "the Codex configuration's hooks is not a table; fix it, then run setup again",
        ));
    };
    for (event, matcher) in CODEX_EVENTS {
        let not_array = || {
            AppError::invalid(format!(
                "the Codex configuration's hooks.{event} is not an array of hook groups; fix it, then run setup again"
            ))
        };
        match hooks.get_mut(event) {
            None => {}
            Some(toml_edit::Item::ArrayOfTables(groups)) => {
                groups.retain(|g| {
                    let mut g = g.clone();
                    !drop_ours(&mut g)
                });
                for g in groups.iter_mut() {
                    drop_ours(g);
                }
            }
            Some(toml_edit::Item::Value(toml_edit::Value::Array(groups))) => {
                groups.retain(|g| {
                    g.as_inline_table().is_none_or(|t| {
                        let mut t = t.clone();
                        !drop_ours(&mut t)
                    })
                });
                for g in groups.iter_mut() {
                    if let Some(t) = g.as_inline_table_mut() {
                        drop_ours(t);
                    }
                }
            }
            Some(_) => return Err(not_array()),
        }
        if !remove {
            let mut handler = toml_edit::Table::new();
            handler["type"] = toml_edit::value("command");
            handler["command"] = toml_edit::value(command.clone());
            handler["timeout"] = toml_edit::value(HOOK_TIMEOUT_SECS as i64);
            let mut group = toml_edit::Table::new();
            if let Some(m) = matcher {
                group["matcher"] = toml_edit::value(m);
            }
            match hooks.get_mut(event) {
                Some(toml_edit::Item::Value(toml_edit::Value::Array(groups))) => {
                    let mut inline = group.into_inline_table();
                    inline.insert(
                        "hooks",
                        toml_edit::Value::Array(toml_edit::Array::from_iter([
                            toml_edit::Value::InlineTable(handler.into_inline_table()),
                        ])),
                    );
                    groups.push(inline);
                }
                _ => {
                    let mut list = toml_edit::ArrayOfTables::new();
                    list.push(handler);
                    group.insert("hooks", toml_edit::Item::ArrayOfTables(list));
                    let groups = hooks
                        .entry(event)
                        .or_insert_with(|| toml_edit::Item::ArrayOfTables(Default::default()));
                    let Some(groups) = groups.as_array_of_tables_mut() else {
                        return Err(not_array());
                    };
                    groups.push(group);
                }
            }
        }
        let empty = match hooks.get(event) {
            Some(toml_edit::Item::ArrayOfTables(g)) => g.is_empty(),
            Some(toml_edit::Item::Value(toml_edit::Value::Array(g))) => g.is_empty(),
            _ => false,
        };
        if empty {
            hooks.remove(event);
        }
    }
    if hooks.is_empty() {
        doc.remove("hooks");
    }
    Ok(())
}

/// A unified diff of `old` → `new` labelled with `path` (empty when they are the same).
pub fn diff(path: &str, old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("{path} (now)"), &format!("{path} (after setup)"))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn how() -> Invocation {
        Invocation {
            program: "/usr/local/bin/abridge".into(),
            global: vec!["--db".into(), "/home/me/my db/abridge.db".into()],
        }
    }

    #[test]
    fn claude_settings_are_merged_idempotently_and_removed_cleanly() {
        let mine = r#"{"model": "opus", "hooks": {"Stop": [{"hooks": [{"type": "command", "command": "say done"}]}]}}"#;
        let once = claude_settings(mine, &how(), false).unwrap();
        let v: Value = serde_json::from_str(&once).unwrap();
        assert_eq!(v["model"], "opus");
        assert_eq!(v["hooks"]["Stop"].as_array().unwrap().len(), 2);
        assert_eq!(v["hooks"]["Stop"][0]["hooks"][0]["command"], "say done");
        assert_eq!(
            v["hooks"]["SessionStart"][0]["matcher"],
            "startup|resume|clear|compact"
        );
        assert_eq!(
            v["hooks"]["PreCompact"][0]["hooks"][0]["command"],
            "/usr/local/bin/abridge --db '/home/me/my db/abridge.db' hook"
        );
        let twice = claude_settings(&once, &how(), false).unwrap();
        assert_eq!(once, twice, "a second run changes nothing");
        let removed = claude_settings(&twice, &how(), true).unwrap();
        let r: Value = serde_json::from_str(&removed).unwrap();
        assert_eq!(r, serde_json::from_str::<Value>(mine).unwrap());
        assert!(
            claude_settings("{", &how(), false)
                .unwrap_err()
                .message
                .contains("not valid JSON")
        );
    }

    #[test]
    fn the_users_key_order_and_indentation_are_kept() {
        let mine = "{\n    \"zeta\": 1,\n    \"model\": \"opus\",\n    \"alpha\": {\"b\": 2, \"a\": 1},\n    \"hooks\": {\"Stop\": [{\"hooks\": [{\"type\": \"command\", \"command\": \"say done\"}]}]}\n}\n";
        let once = claude_settings(mine, &how(), false).unwrap();
        let keys: Vec<&str> = once
            .lines()
            .filter(|l| l.starts_with("    \"") && !l.starts_with("     "))
            .map(|l| l.trim().split('"').nth(1).unwrap())
            .collect();
        assert_eq!(keys, ["zeta", "model", "alpha", "hooks"], "{once}");
        assert!(
            once.contains("\n        \"b\": 2,\n        \"a\": 1\n"),
            "{once}"
        );
        // Taken out again: the user's file as it was, but for the whitespace of one line.
        let removed = claude_settings(&once, &how(), true).unwrap();
        let back: Value = serde_json::from_str(&removed).unwrap();
        assert_eq!(back, serde_json::from_str::<Value>(mine).unwrap());
        assert!(
            removed.starts_with("{\n    \"zeta\": 1,\n    \"model\""),
            "{removed}"
        );
    }

    #[test]
    fn mcp_servers_and_codex() {
        let mcp = claude_mcp(
            r#"{"mcpServers": {"other": {"command": "x"}}, "theme": "dark"}"#,
            &how(),
            false,
        )
        .unwrap();
        let v: Value = serde_json::from_str(&mcp).unwrap();
        assert_eq!(
            v["mcpServers"]["abridge"]["args"],
            json!(["--db", "/home/me/my db/abridge.db", "mcp"])
        );
        assert_eq!(v["mcpServers"]["other"]["command"], "x");
        assert_eq!(claude_mcp(&mcp, &how(), false).unwrap(), mcp);
        let back: Value = serde_json::from_str(&claude_mcp(&mcp, &how(), true).unwrap()).unwrap();
        assert!(back["mcpServers"].get("abridge").is_none());
        let toml = "# my settings\nmodel = \"o4\"\n\n[mcp_servers.other]\ncommand = \"x\"\n";
        let once = codex_config(toml, &how(), false).unwrap();
        assert!(once.starts_with("# my settings\nmodel = \"o4\""), "{once}");
        assert!(once.contains("[mcp_servers.abridge]"), "{once}");
        assert_eq!(codex_config(&once, &how(), false).unwrap(), once);
        assert_eq!(codex_config(&once, &how(), true).unwrap(), toml);
    }

    /// Codex's hooks, read back the way Codex reads them: `hooks.<Event>` is a list of groups,
    /// each with an optional `matcher` and a list of `{type, command, timeout}` handlers.
    fn codex_handlers(text: &str, event: &str) -> Vec<(Option<String>, String)> {
        let v: toml::Value = toml::from_str(text).unwrap();
        let mut out = Vec::new();
        for g in v["hooks"]
            .get(event)
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
        {
            for h in g["hooks"].as_array().unwrap() {
                assert_eq!(h["type"].as_str(), Some("command"));
                out.push((
                    g.get("matcher").and_then(|m| m.as_str()).map(String::from),
                    h["command"].as_str().unwrap().to_string(),
                ));
            }
        }
        out
    }

    #[test]
    fn codex_hooks_are_merged_beside_the_users_own_and_their_trust() {
        // The user's own hooks in both TOML spellings, and the trust Codex recorded.
        let mine = "model = \"o4\"\n\n[[hooks.Stop]]\n[[hooks.Stop.hooks]]\ntype = \"command\"\ncommand = \"say done\"\n\n[hooks]\nSessionStart = [{ hooks = [{ type = \"command\", command = \"/other/start\" }] }]\n\n[hooks.state.\"/home/me/.codex/config.toml:stop:0:0\"]\ntrusted_hash = \"sha256:00\"\n";
        let before: toml::Value = toml::from_str(mine).unwrap();
        let once = codex_config(mine, &how(), false).unwrap();
        let ours = "/usr/local/bin/abridge --db '/home/me/my db/abridge.db' hook".to_string();
        assert_eq!(
            codex_handlers(&once, "Stop"),
            [(None, "say done".into()), (None, ours.clone())],
            "{once}"
        );
        assert_eq!(
            codex_handlers(&once, "SessionStart"),
            [
                (None, "/other/start".into()),
                (Some("startup|resume|clear|compact".into()), ours.clone())
            ],
            "{once}"
        );
        assert_eq!(codex_handlers(&once, "PreCompact"), [(None, ours.clone())]);
        let after: toml::Value = toml::from_str(&once).unwrap();
        assert_eq!(after["hooks"]["state"], before["hooks"]["state"]);
        assert_eq!(after["model"].as_str(), Some("o4"));
        // Idempotent, and removed cleanly.
        assert_eq!(codex_config(&once, &how(), false).unwrap(), once);
        let removed = codex_config(&once, &how(), true).unwrap();
        assert_eq!(toml::from_str::<toml::Value>(&removed).unwrap(), before);
        // From nothing: the hooks in tables Codex reads, and nothing left after --remove.
        let fresh = codex_config("", &how(), false).unwrap();
        assert!(fresh.contains("[[hooks.SessionStart]]"), "{fresh}");
        assert_eq!(codex_handlers(&fresh, "Stop"), [(None, ours)]);
        assert_eq!(codex_config(&fresh, &how(), true).unwrap().trim(), "");
        assert!(
            codex_config("hooks = 3\n", &how(), false)
                .unwrap_err()
                .message
                .contains("hooks is not a table")
        );
    }

    #[test]
    fn diffs() {
        assert!(!diff("f", "a\n", "b\n").is_empty());
        assert!(diff("f", "a\n", "a\n").is_empty());
    }
}
