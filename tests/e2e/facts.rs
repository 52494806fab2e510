//! Facts that change, as a user reads them: `abridge facts SESSION` and `GET
//! /v1/sessions/{id}/facts` on a dated chat in which a person moves, changes manager and sells
//! the car, imported with `abridge summarize`.

use serde_json::{Value, json};

use crate::harness::*;
use crate::serve::{Server, get};

/// A dated chat of one person and an assistant: facts stated, changed and ended among small
/// talk, one message a day.
fn chat() -> String {
    let said = [
        "I live in Porto, close to the river.",
        "I drive a blue Skoda to work every day.",
        "My manager is Ana Ruiz, she is very patient.",
        "The weather has been grey all week.",
        "Big news: we moved to Lyon last weekend!",
        "I tried a new lentil soup recipe yesterday.",
        "I got reassigned, Tom Becker is my manager now.",
        "I watched a documentary about octopuses.",
        "I sold the blue Skoda, I take the bus now.",
        "My neighbour practised the trumpet again.",
    ];
    let mut lines = String::new();
    for (i, text) in said.iter().enumerate() {
        let day = format!("2025-03-{:02}T10:00:00Z", i * 2 + 1);
        lines.push_str(
            &json!({"role": "user", "name": "Robin", "content": text, "timestamp": day})
                .to_string(),
        );
        lines.push('\n');
        lines.push_str(
            &json!({"role": "assistant", "content": "Thanks for telling me.", "timestamp": day})
                .to_string(),
        );
        lines.push('\n');
    }
    lines
}

fn fact<'a>(facts: &'a [Value], key: &str) -> &'a Value {
    facts
        .iter()
        .find(|f| f["key"] == key)
        .unwrap_or_else(|| panic!("no fact '{key}' in {facts:?}"))
}

#[test]
fn the_facts_view_lists_what_holds_now_what_it_replaced_and_where_it_was_said() {
    let env = Env::new();
    let file = env.write("chat.jsonl", chat());
    env.run(&[
        "--backend",
        "extractive",
        "summarize",
        file.to_str().unwrap(),
        "--format",
        "jsonl",
        "--session",
        "robin",
    ])
    .assert_ok();
    let v = env.run(&["facts", "robin", "--json"]).assert_ok().json();
    let facts = v["facts"].as_array().unwrap().clone();
    let lives = fact(&facts, "lives in");
    assert_eq!(lives["who"], "Robin");
    assert_eq!(lives["current"], "Lyon");
    let values: Vec<&str> = lives["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["Porto", "Lyon"]);
    // Each value names the episode that said it: the user's 1st and 5th messages.
    assert_eq!(lives["values"][0]["episode"], 1);
    assert_eq!(lives["values"][1]["episode"], 9);
    assert_eq!(fact(&facts, "manager")["current"], "Tom Becker");
    let car = fact(&facts, "car");
    assert_eq!(car["current"], Value::Null, "{car}");
    assert_eq!(car["ended"]["episode"], 17);
    assert!(
        car["line"]
            .as_str()
            .unwrap()
            .contains("none since 17 Mar 2025")
    );
    // The newest change first.
    assert_eq!(facts[0]["key"], "car");
    // As text: each fact's line and its episodes, and with --messages what they said.
    let text = env.run(&["facts", "robin", "--messages"]);
    text.assert_ok();
    assert!(
        text.stdout
            .contains("Robin lives in: Lyon (since 9 Mar 2025; before: Porto)  [#1, #9]"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout
            .contains("    #9 Robin: Big news: we moved to Lyon last weekend!")
    );
    // Over HTTP, the same facts.
    let server = Server::start(&env, &[]);
    let r = get(&server.addr, "/v1/sessions/robin/facts", None);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["facts"], v["facts"]);
    assert_eq!(
        get(&server.addr, "/v1/sessions/nobody/facts", None).status,
        404
    );
    // A session that states none says so, and lists none.
    let other = env.write(
        "small.jsonl",
        "{\"role\":\"user\",\"content\":\"hello there\"}\n",
    );
    env.run(&[
        "summarize",
        other.to_str().unwrap(),
        "--format",
        "jsonl",
        "--session",
        "quiet",
    ])
    .assert_ok();
    let none = env.run(&["facts", "quiet"]);
    none.assert_ok();
    assert!(none.stdout.is_empty() && none.stderr.contains("states no facts"));
}

/// Memories that supersede, as the CLI and the HTTP API show them: a changed fact replaces the
/// earlier memory (kept, marked), recall puts the current one first and marks the old one, a
/// client may name what a memory replaces, and a name that is wrong says what to give.
#[test]
fn a_changed_fact_supersedes_the_earlier_memory_over_the_cli_and_http() {
    let env = crate::serve::extractive();
    let add = |args: &[&str]| {
        let mut all = vec!["memory", "add"];
        all.extend_from_slice(args);
        env.run(&all)
    };
    add(&[
        "I live in Porto, by the river Douro",
        "--user",
        "alice",
        "--id",
        "porto",
    ])
    .assert_ok();
    let moved = add(&["Alice moved to Lyon", "--user", "alice", "--id", "lyon"]);
    moved.assert_ok();
    assert!(moved.stdout.contains("replaces porto"), "{}", moved.stdout);
    let show = env.run(&["memory", "show", "porto"]);
    show.assert_ok();
    assert!(
        show.stdout
            .contains("no longer current: replaced by lyon on "),
        "{}",
        show.stdout
    );
    let r = env
        .run(&["recall", "Porto river Douro", "--user", "alice", "--json"])
        .assert_ok()
        .json();
    let ids: Vec<&str> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids[..2], ["lyon", "porto"], "{r}");
    assert_eq!(r["results"][1]["superseded_by"], "lyon");
    assert!(r["results"][1]["superseded_ms"].as_u64().unwrap() > 0);
    assert_eq!(r["results"][0]["superseded_by"], Value::Null);
    let text = env.run(&["recall", "Porto river Douro", "--user", "alice"]);
    text.assert_ok();
    assert!(text.stdout.contains("no longer current: replaced by lyon"));
    // A wrong name is refused with what to give.
    let bad = add(&["x", "--user", "alice", "--replaces", "nope"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("does not exist"), "{}", bad.stderr);
    // Over HTTP: the write answers what it replaced, the list and recall mark it.
    let t = crate::serve::token(&env, "acme", &[]);
    let srv = Server::start(&env, &[]);
    let w = crate::serve::post(
        &srv.addr,
        "/v1/memories",
        Some(&t),
        &json!({"memories": [
            {"id": "car", "user": "bob", "text": "Bob drives a blue Skoda"},
            {"id": "sold", "user": "bob", "text": "Bob sold his car last week"},
            {"id": "tea", "user": "bob", "text": "Bob drinks green tea", "replaces": "sold"},
        ]}),
    )
    .expect(202);
    assert_eq!(w["memories"][0]["supersedes"], Value::Null, "{w}");
    assert_eq!(w["memories"][1]["supersedes"], "car", "{w}");
    assert_eq!(w["memories"][2]["supersedes"], "sold", "{w}");
    let m = get(&srv.addr, "/v1/memories/car", Some(&t)).expect(200);
    assert_eq!(m["superseded_by"], "sold", "{m}");
    let m = get(&srv.addr, "/v1/memories/sold", Some(&t)).expect(200);
    assert_eq!(
        (&m["supersedes"], &m["superseded_by"]),
        (&json!("car"), &json!("tea"))
    );
    let r = crate::serve::post(
        &srv.addr,
        "/v1/recall",
        Some(&t),
        &json!({"query": "Bob drives a blue Skoda", "user": "bob", "k": 5}),
    )
    .expect(200);
    let hits = r["results"].as_array().unwrap();
    let at = |id: &str| hits.iter().position(|h| h["id"] == id);
    let car = at("car").unwrap_or_else(|| panic!("{r}"));
    // What is current in its place is the end of its chain: car → sold → tea.
    assert!(at("tea").is_some_and(|s| s < car), "{r}");
    assert_eq!(hits[car]["superseded_by"], "sold");
    // Another tenant's memory cannot be named.
    let other = crate::serve::token(&env, "globex", &[]);
    let e = crate::serve::post(
        &srv.addr,
        "/v1/memories",
        Some(&other),
        &json!({"user": "bob", "text": "Bob lives in Rome", "replaces": "car"}),
    );
    assert!(e.body.contains("does not exist"), "{}", e.body);
    assert_eq!(e.status, 400, "{}", e.body);
}
