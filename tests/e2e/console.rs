//! The web console in a real headless Chromium, driven over WebDriver (Debian's
//! `chromedriver`), against the real `abridge serve` binary and the test model server.
//!
//! Without Chromium the tests report SKIPPED with the install command; with
//! `ABRIDGE_REQUIRE_BROWSER=1` (CI) a missing browser is a failure. Each run writes screenshots
//! of every page at desktop and phone width to `docs/console/` (linked from the README).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use abridge_test_llm::Options;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::harness::*;
use crate::serve::{Server, get, messages, post, post_messages, token};

const INSTALL: &str = "apt-get update && apt-get install -y chromium chromium-driver";
const DESKTOP: (u32, u32) = (1280, 1000);
const PHONE: (u32, u32) = (390, 1100);

fn tool(var: &str, default: &str) -> Option<PathBuf> {
    let p = std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
    p.exists().then_some(p)
}

/// Chromium and its driver, or None (SKIPPED) when they are not installed.
fn browser_tools(test: &str) -> Option<(PathBuf, PathBuf)> {
    match (
        tool("ABRIDGE_CHROMIUM", "/usr/bin/chromium"),
        tool("ABRIDGE_CHROMEDRIVER", "/usr/bin/chromedriver"),
    ) {
        (Some(c), Some(d)) => Some((c, d)),
        _ if std::env::var_os("ABRIDGE_REQUIRE_BROWSER").is_some() => {
            panic!(
                "{test}: Chromium or chromedriver is missing and ABRIDGE_REQUIRE_BROWSER is set; install them with: {INSTALL}"
            )
        }
        _ => {
            eprintln!(
                "SKIPPED {test}: Chromium and chromedriver are not installed; install them with: {INSTALL}"
            );
            None
        }
    }
}

/// A chromedriver on a free loopback port with one headless Chromium session; both end on
/// drop.
struct Browser {
    driver: Child,
    client: Option<Client>,
    _profile: tempfile::TempDir,
}

impl Browser {
    async fn start(chromium: &Path, driver: &Path) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(driver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("chromedriver did not listen on {url}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap();
        // As root in a container, and on a machine without outside network: no sandbox, no
        // background connections (they are refused here, many at a time).
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--hide-scrollbars".into(),
            format!("--window-size={},{}", DESKTOP.0, DESKTOP.1),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"binary": chromium, "args": args}),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .expect("a Chromium session through chromedriver");
        Browser {
            driver: child,
            client: Some(client),
            _profile: profile,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().expect("open")
    }

    async fn close(mut self) {
        if let Some(c) = self.client.take() {
            let _ = c.close().await;
        }
    }

    /// Evaluate `body` (a function body) in the page.
    async fn js(&self, body: &str) -> Value {
        self.c().execute(body, vec![]).await.expect("script runs")
    }

    /// Wait until `body` returns something truthy; its value.
    async fn until(&self, what: &str, body: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.js(body).await;
            if !matches!(v, Value::Null | Value::Bool(false)) {
                return v;
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
    }

    /// The element `css` names, waited for: after a click that submits a form the next page
    /// may not be there yet.
    async fn element(&self, css: &str) -> fantoccini::elements::Element {
        self.c()
            .wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
    }

    async fn text(&self, css: &str) -> String {
        self.element(css).await.text().await.unwrap()
    }

    async fn click(&self, css: &str) {
        self.element(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    async fn shown(&self, css: &str) -> bool {
        self.element(css).await.is_displayed().await.unwrap()
    }

    async fn page(&self, url: &str) {
        self.c().goto(url).await.unwrap();
    }

    /// Screenshots of the current page at desktop and phone width, as
    /// `docs/console/NAME-desktop.png` and `…-phone.png`; the page must not scroll sideways
    /// at phone width.
    async fn shots(&self, name: &str) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console");
        std::fs::create_dir_all(&dir).unwrap();
        for (label, (w, h)) in [("desktop", DESKTOP), ("phone", PHONE)] {
            self.c().set_window_size(w, h).await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
            if label == "phone" {
                let over = self
                    .js("return document.documentElement.scrollWidth - document.documentElement.clientWidth;")
                    .await;
                assert!(
                    over.as_i64().unwrap_or(0) <= 1,
                    "{name} scrolls sideways at phone width by {over} px"
                );
            }
            let png = self.c().screenshot().await.unwrap();
            assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
            std::fs::write(dir.join(format!("{name}-{label}.png")), png).unwrap();
        }
        self.c()
            .set_window_size(DESKTOP.0, DESKTOP.1)
            .await
            .unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

async fn sign_in(b: &Browser, base: &str, token: &str) {
    b.page(&format!("{base}/")).await;
    // Without a token the console asks for one.
    assert!(
        b.c()
            .current_url()
            .await
            .unwrap()
            .path()
            .ends_with("/login"),
        "no sign-in page"
    );
    b.c()
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    b.click("form[action='/login'] button").await;
    b.until(
        "the sessions list",
        "return document.querySelector('h1') && document.querySelector('h1').textContent === 'Sessions';",
    )
    .await;
}

#[test]
fn sign_in_find_a_session_watch_its_refresh_live_and_reset_it_after_confirming() {
    let Some((chromium, driver)) = browser_tools("console refresh and reset") else {
        return;
    };
    // A model that takes 600 ms a call, and a context small enough that 40 long messages are
    // a map-reduce of several calls: the bar has steps to show, each long enough for the page
    // to be read while it shows (at 200 ms a loaded machine once saw only the reduce).
    let llm = TestServer::start_with(Options {
        delay: Duration::from_millis(600),
        ..Options::default()
    });
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url());
    let acme = token(&env, "acme", &[]);
    let globex = token(&env, "globex", &[]);
    let srv = Server::start(
        &env,
        &[
            "--context-length",
            "1024",
            "--max-output-tokens",
            "120",
            "--threshold-tokens",
            "100000",
            // One call at a time: each map step lasts a model call, long enough to be seen.
            "--concurrency",
            "1",
        ],
    );
    let addr = srv.addr.as_str();
    let base = format!("http://{addr}");
    post_messages(
        addr,
        Some(&acme),
        "support%2F42",
        &messages("long", 80, false),
    )
    .expect(202);
    for i in 0..3 {
        post_messages(
            addr,
            Some(&acme),
            &format!("chat-{i}"),
            &messages("short", 4, false),
        )
        .expect(202);
    }
    post_messages(
        addr,
        Some(&globex),
        "globex-plans",
        &messages("long", 4, false),
    )
    .expect(202);

    runtime().block_on(async {
        let b = Browser::start(&chromium, &driver).await;
        // A wrong token is refused on the sign-in page.
        b.page(&format!("{base}/login")).await;
        b.c().find(Locator::Css("#token")).await.unwrap().send_keys("abr_wrong").await.unwrap();
        b.click("form[action='/login'] button").await;
        assert!(b.text("#login-error").await.contains("does not accept"), "wrong token accepted");
        sign_in(&b, &base, &acme).await;

        // The list: this tenant's sessions only, with their state.
        let listed = b.text("table.sessions tbody").await;
        assert!(listed.contains("support/42") && listed.contains("chat-2"), "{listed}");
        assert!(!listed.contains("globex-plans"), "another tenant's session is listed");
        b.shots("sessions").await;
        // Search.
        b.c().find(Locator::Css("#q")).await.unwrap().send_keys("42").await.unwrap();
        b.click("form[role=search] button").await;
        b.until("the search", "return location.search.includes('q=42');").await;
        let found = b.text("table.sessions tbody").await;
        assert!(found.contains("support/42") && !found.contains("chat-1"), "{found}");

        // Another tenant's session is a 404, as in the API.
        b.page(&format!("{base}/sessions/globex-plans")).await;
        let body = b.text("main").await;
        assert!(body.contains("404") && body.contains("no session"), "{body}");
        assert!(!b.c().source().await.unwrap().contains("long message"), "foreign content shown");

        // The session: no summary yet; every message marked as not summarized.
        b.page(&format!("{base}/sessions/support%2F42")).await;
        assert!(b.text("#chain").await.contains("No summary yet"));
        assert_eq!(
            b.js("return document.querySelectorAll('.msg.uncovered').length;").await,
            json!(80)
        );
        // Refresh: the bar fills live, the new card appears, and the page never reloads.
        b.js("window.__stay = 'same page'; return true;").await;
        b.click("#refresh").await;
        let mut seen: Vec<(f64, f64, String)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let v = b
                .js("const p = document.querySelector('#live-job progress'); \
                     return p ? [Number(p.value), Number(p.max), \
                       document.querySelector('#live-job .job-percent').textContent, \
                       document.querySelectorAll('#chain [data-row]').length, \
                       document.querySelector('#live-job .job-stage').textContent] : null;")
                .await;
            if let Some(a) = v.as_array() {
                let (val, max) = (a[0].as_f64().unwrap(), a[1].as_f64().unwrap());
                let step = (val, max, a[4].as_str().unwrap_or("").to_string());
                if seen.last() != Some(&step) {
                    seen.push(step);
                }
                if val == max && a[2] == "100 %" && a[3] == 1 {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the bar did not reach 100 %: {seen:?}");
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert!(
            seen.iter().any(|(v, m, stage)| *m > 1.0 && *v > 0.0 && v < m && stage == "map"),
            "no step between empty and full was shown: {seen:?}"
        );
        assert_eq!(b.js("return window.__stay;").await, json!("same page"), "the page reloaded");
        let card = b.text("#chain [data-row] h3").await;
        assert!(card.contains("Episodes 1–80"), "{card}");
        let facts = b.text("#chain [data-row] .facts").await;
        assert!(facts.contains("in 80 messages") && facts.contains("prompt"), "{facts}");
        // The API agrees with what the page shows.
        let chain = get(addr, "/v1/sessions/support%2F42/summaries", Some(&acme)).expect(200);
        let row = chain["summaries"][0]["id"].as_u64().unwrap();
        assert_eq!(
            b.js("return document.querySelector('#chain [data-row]').dataset.row;").await,
            json!(row.to_string())
        );
        // After a reload every message is marked by that row, and the preview counts tokens.
        b.page(&format!("{base}/sessions/support%2F42?budget=600")).await;
        assert_eq!(
            b.js(&format!("return document.querySelectorAll('a.covered[href=\"#row-{row}\"]').length;")).await,
            json!(80)
        );
        let figures = b.text("#context-figures").await;
        // One figure for the history's size on the page: the facts' "History"; the preview
        // says what it saves against it.
        assert!(figures.contains("less than the whole history"), "{figures}");
        assert!(!figures.contains("for the full history"), "{figures}");
        b.shots("session").await;
        b.page(&format!("{base}/jobs")).await;
        assert!(b.text("#jobs").await.contains("succeeded"));
        b.shots("jobs").await;

        // Reset asks first; "No" keeps it, "Yes" deletes it.
        b.page(&format!("{base}/sessions/support%2F42")).await;
        b.click("#reset").await;
        assert!(b.text("h1").await.contains("Reset this session?"));
        b.shots("reset").await;
        b.click("a.button[href='/sessions/support%2F42']").await;
        assert_eq!(get(addr, "/v1/sessions/support%2F42", Some(&acme)).status, 200);
        b.click("#reset").await;
        b.click("#confirm-reset").await;
        b.until(
            "the reset notice",
            "return document.querySelector('.notice') && document.querySelector('.notice').textContent.includes('reset');",
        )
        .await;
        assert!(!b.text("main").await.contains("support/42"));
        assert_eq!(get(addr, "/v1/sessions/support%2F42", Some(&acme)).status, 404);
        // The other tenant's session is untouched.
        assert_eq!(get(addr, "/v1/sessions/globex-plans", Some(&globex)).status, 200);
        b.close().await;
    });
}

#[test]
fn memories_with_expandable_sources_recall_usage_against_the_ceiling_and_forms_from_elsewhere() {
    let Some((chromium, driver)) = browser_tools("console memories and usage") else {
        return;
    };
    let llm = TestServer::start();
    let env = Env::new()
        .with("ABRIDGE_BACKEND", "ollama")
        .with("EXTRACTION_URL", &llm.url())
        .with("ABRIDGE_MONTHLY_TOKENS", "50000");
    let acme = token(&env, "acme", &[]);
    let srv = Server::start(&env, &["--sweep-secs", "1"]);
    let addr = srv.addr.as_str();
    let base = format!("http://{addr}");
    let facts = [
        "Alice prefers the dark theme in her editor",
        "Alice uses a dark theme with large fonts in the editor",
        "Alice wants the editor theme dark at night",
    ];
    let mut memories: Vec<Value> = facts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": format!("m{i}"), "user": "alice", "project": "web", "type": "preference",
                   "key": "editor", "text": t, "importance": 0.6})
        })
        .collect();
    memories.push(
        json!({"id": "lonely", "user": "alice", "project": "web", "type": "fact",
                         "key": "billing", "text": "Invoices go out on the first Monday"}),
    );
    post(
        addr,
        "/v1/memories",
        Some(&acme),
        &json!({ "memories": memories }),
    )
    .expect(202);
    let deadline = Instant::now() + Duration::from_secs(60);
    let summarized = loop {
        let c = get(addr, "/v1/clusters", Some(&acme)).expect(200);
        if let Some(cl) = c["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["key"] == "editor" && c["summary"].is_u64())
        {
            break cl["id"].as_u64().unwrap();
        }
        assert!(Instant::now() < deadline, "no cluster summary: {c}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let usage = get(addr, "/v1/usage", Some(&acme)).expect(200);
    assert!(usage["calls"].as_u64().unwrap() >= 1, "{usage}");
    assert_eq!(usage["days"][0]["calls"], usage["calls"], "{usage}");

    runtime().block_on(async {
        let b = Browser::start(&chromium, &driver).await;
        sign_in(&b, &base, &acme).await;
        b.page(&format!("{base}/memories")).await;
        let card = format!("#cluster-{summarized}");
        // Sources are folded away until asked for.
        let source = format!("{card} details.sources li");
        assert!(!b.shown(&source).await, "sources shown before expanding");
        b.click(&format!("{card} details.sources summary")).await;
        assert!(b.shown(&source).await, "sources hidden after expanding");
        let listed = b.text(&format!("{card} details.sources")).await;
        for f in facts {
            assert!(listed.contains(f), "{f} missing from {listed}");
        }
        // The single memory is a sparse cluster, shown apart.
        let sparse = b.text(".cluster.sparse").await;
        assert!(sparse.contains("billing"), "{sparse}");
        b.shots("memories").await;
        // Recall.
        b.c()
            .find(Locator::Css("#recall"))
            .await
            .unwrap()
            .send_keys("dark editor theme")
            .await
            .unwrap();
        b.click("form[role=search] button").await;
        b.until(
            "recall results",
            "return !!document.getElementById('recall-results');",
        )
        .await;
        let results = b.text("#recall-results").await;
        assert!(results.contains("dark"), "{results}");
        // Every memory, flat, with its text, user, key and cluster; one is deleted from here.
        b.page(&format!("{base}/memories")).await;
        let flat = b.text("#all-memories").await;
        for f in facts {
            assert!(flat.contains(f), "{f} missing from {flat}");
        }
        assert!(flat.contains("alice") && flat.contains("preference · editor"), "{flat}");
        assert!(flat.contains("Invoices go out on the first Monday"), "{flat}");
        b.click("#memory-lonely button.danger").await;
        b.until(
            "the deletion notice",
            "return document.querySelector('.notice') && document.querySelector('.notice').textContent.includes('deleted');",
        )
        .await;
        assert!(!b.text("#all-memories").await.contains("Invoices go out"));
        get(addr, "/v1/memories/lonely", Some(&acme)).expect(404);
        // Usage: the chart with its date axis, today's row and the ceiling.
        b.page(&format!("{base}/usage")).await;
        assert!(
            b.js("return document.querySelectorAll('svg.chart g.dates text').length;")
                .await
                .as_u64()
                .unwrap()
                >= 4
        );
        assert!(
            b.js("return document.querySelectorAll('svg.chart rect.day').length;")
                .await
                .as_u64()
                .unwrap()
                >= 1
        );
        assert!(
            b.js("return !!document.querySelector('svg.chart line.ceiling');")
                .await
                .as_bool()
                .unwrap()
        );
        let facts = b.text("dl.facts").await;
        assert!(
            facts.contains("50,000 tokens a month") && facts.contains("% spent"),
            "{facts}"
        );
        let today = usage["days"][0]["day"].as_str().unwrap();
        assert!(b.text("table tbody").await.contains(today));
        b.shots("usage").await;
        b.page(&format!("{base}/login")).await;
        b.shots("login").await;
        b.close().await;
    });

    // A form posted from another origin is refused, even with the visitor's cookie.
    let cookie = format!("abridge_token={acme}");
    let r = crate::serve::request_with(
        addr,
        "POST",
        "/sessions/x/reset",
        &[
            ("Cookie", &cookie),
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        b"csrf=whatever",
    );
    assert_eq!(r.status, 403, "{}", r.body);
    // Pages need a token: without one the console sends the browser to sign in.
    let r = crate::serve::request_with(addr, "GET", "/usage", &[], b"");
    assert_eq!(r.status, 303);
}
