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
