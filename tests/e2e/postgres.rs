//! PostgreSQL as the shared store (a real server started by the harness; SKIPPED without
//! one): the chain and cluster rules under concurrent writers from separate connection pools,
//! sealing at rest, and the refusals (a newer schema, another program's database). The store
//! conformance suite itself runs beside the traits, in `host/store/tests/conformance.rs`.

use std::sync::Arc;

use abridge_engine::types::{MemoryFilter, NewMemory};
use abridge_store::{PgStore, RecallStore, SqliteStore, Store};

/// The shared test server, or `None` (SKIPPED is printed once).
fn server() -> Option<&'static abridge_test_pg::Server> {
    abridge_test_pg::shared()
}

/// A PostgreSQL store on a new database (`None` without PostgreSQL).
pub(crate) async fn pg_store(label: &str) -> Option<(PgStore, String)> {
    let url = server()?.database(label);
    Some((PgStore::connect(&url).await.expect("connect"), url))
}

#[path = "../../host/store/tests/common/mod.rs"]
mod common;
use common::{ep, memory, scope, write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_and_cluster_rules_hold_with_writers_on_separate_pools() {
    let Some((a, url)) = pg_store("stress").await else {
        return;
    };
    // Three "instances": three pools on one database.
    let stores: Vec<Arc<PgStore>> = vec![
        Arc::new(a),
        Arc::new(PgStore::connect(&url).await.unwrap()),
        Arc::new(PgStore::connect(&url).await.unwrap()),
    ];
    let mut tasks = Vec::new();
    for (w, s) in stores.iter().enumerate() {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut wrote = 0;
            for i in 0..40 {
                // Everyone appends to the same sessions and races to extend their chains.
                let session = format!("s{}", i % 4);
                s.append_episodes(&session, vec![ep(i, &format!("w{w}-{i}"))])
                    .await
                    .unwrap();
                let n = s.stats(&session).await.unwrap().episodes;
                let prev = s.latest_summary(&session).await.unwrap();
                let first = prev.as_ref().map_or(1, |p| p.last_episode + 1);
                if first <= n
                    && s.write_summary(&session, write(None, first, n, "x"))
                        .await
                        .is_ok()
                {
                    wrote += 1;
                }
                // And memories into one cluster of one tenant.
                let mut m = memory(&format!("w{w}-{i}"), "fact", [1.0, w as f32, 0.0], None);
                if let Some(c) = s.centroids("acme", &scope("k")).await.unwrap().first() {
                    m.cluster = Some(c.cluster);
                }
                let _ = s.put_memory("acme", m).await;
            }
            wrote
        }));
    }
    let mut wrote = 0;
    for t in tasks {
        wrote += t.await.unwrap();
    }
    let s = &stores[0];
    assert!(wrote > 0);
    for i in 0..4 {
        let session = format!("s{i}");
        let chain = s.summaries(&session).await.unwrap();
        let mut next = 1;
        for r in &chain {
            assert_eq!(r.first_episode, next, "{session}: {chain:?}");
            next = r.last_episode + 1;
        }
        let eps = s.episodes_after(&session, 0, 1000).await.unwrap();
        let ids: Vec<u64> = eps.iter().map(|e| e.id).collect();
        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{session}");
        assert_eq!(ids.len(), 30, "{session}: every message stored once");
    }
    // Cluster sums and member counts agree with the members.
    for c in s.clusters("acme", &MemoryFilter::default()).await.unwrap() {
        let members = s.cluster_members("acme", c.id).await.unwrap();
        assert_eq!(c.members as usize, members.len());
    }
    let (_, total) = s
        .list_memories("acme", &MemoryFilter::default(), 0, 1)
        .await
        .unwrap();
    let counted: u32 = s
        .clusters("acme", &MemoryFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|c| c.members)
        .sum();
    assert_eq!(total, 120);
    assert_eq!(counted, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_text_is_not_in_the_database_and_refusals_are_clear() {
    let Some(srv) = server() else {
        return;
    };
    let url = srv.database("sealed");
    let key = abridge_store::crypto::Secret::random().unwrap();
    let s = PgStore::connect(&url)
        .await
        .unwrap()
        .with_master_key(key.clone());
    s.put_memory(
        "acme",
        memory("m1", "canary-7f3e the vault code", [1.0, 0.0, 0.0], None),
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_memory("acme", "m1").await.unwrap().unwrap().text,
        "canary-7f3e the vault code"
    );
    let db = url.rsplit('/').next().unwrap();
    let dump = srv
        .psql(db, "SELECT encode(text, 'escape') FROM memories")
        .unwrap();
    assert!(!dump.is_empty() && !dump.contains("canary-7f3e"), "{dump}");
    // Another master key opens nothing; rotation keeps old rows readable.
    let other = PgStore::connect(&url)
        .await
        .unwrap()
        .with_master_key(abridge_store::crypto::Secret::random().unwrap());
    let e = other.get_memory("acme", "m1").await.unwrap_err();
    assert!(format!("{e:?}").contains("master key"), "{e:?}");
    let new = abridge_store::crypto::Secret::random().unwrap();
    assert_eq!(s.rotate_master_key(&new).await.unwrap(), 1);
    let rotated = PgStore::connect(&url).await.unwrap().with_master_key(new);
    assert_eq!(
        rotated
            .get_memory("acme", "m1")
            .await
            .unwrap()
            .unwrap()
            .text,
        "canary-7f3e the vault code"
    );

    // A newer schema is refused, naming the fix.
    srv.psql(db, "UPDATE abridge_schema SET version = 99")
        .unwrap();
    let e = PgStore::connect(&url).await.err().expect("refused");
    assert!(format!("{e:?}").contains("newer abridge"), "{e:?}");
    // Another program's database is left alone.
    let foreign = srv.database("foreign");
    let fdb = foreign.rsplit('/').next().unwrap();
    srv.psql(fdb, "CREATE TABLE invoices (id int)").unwrap();
    let e = PgStore::connect(&foreign).await.err().expect("refused");
    assert!(
        format!("{e:?}").contains("not an abridge database"),
        "{e:?}"
    );
    assert_eq!(
        srv.psql(
            fdb,
            "SELECT count(*) FROM pg_tables WHERE tablename = 'sessions'"
        )
        .unwrap(),
        "0"
    );
    // A server that is not there: the database is named, with the fix, and no password.
    let e = PgStore::connect("postgres://abridge:hunter2@127.0.0.1:1/x")
        .await
        .err()
        .expect("refused");
    let m = format!("{e:?}");
    assert!(
        m.contains("127.0.0.1:1") && m.contains("--db") && !m.contains("hunter2"),
        "{m}"
    );
}

mod instances {
    //! Several `abridge serve` processes (the real binary) on one PostgreSQL database.

    use std::time::{Duration, Instant};

    use abridge_test_llm::{Options, TestServer};
    use serde_json::{Value, json};

    use crate::harness::Env;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use crate::serve::{Server, get, post_messages, request, sse_until, token};

    pub(super) fn env(url: &str, llm: &TestServer) -> Env {
        Env::new()
            .with("ABRIDGE_DB", url)
            .with("ABRIDGE_BACKEND", "ollama")
            .with("EXTRACTION_URL", &llm.url())
    }

    pub(super) const ARGS: &[&str] = &[
        "--context-length",
        "1024",
        "--max-output-tokens",
        "60",
        "--threshold-tokens",
        "40",
        "--min-new-episodes",
        "4",
        "--sweep-secs",
        "0",
        // The test queues a refresh per session by the hundred on purpose.
        "--tenant-queue",
        "0",
    ];

    pub(super) fn four(prefix: &str) -> Value {
        let ms: Vec<Value> = (1..=4)
            .map(|i| {
                json!({
                    "id": format!("{prefix}-{i}"),
                    "role": if i % 2 == 1 { "user" } else { "assistant" },
                    "content": format!("{prefix} message {i}: the billing service moves to cluster {i} on Friday."),
                })
            })
            .collect();
        json!({ "messages": ms })
    }

    fn scalar(srv: &abridge_test_pg::Server, db: &str, sql: &str) -> i64 {
        srv.psql(db, sql).unwrap().trim().parse().unwrap_or(-1)
    }

    pub(super) fn wait_idle(srv: &abridge_test_pg::Server, db: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while scalar(
            srv,
            db,
            "SELECT count(*) FROM jobs WHERE state IN ('queued','running')",
        ) != 0
        {
            assert!(
                Instant::now() < deadline,
                "jobs did not finish: {}",
                srv.psql(db, "SELECT state, count(*) FROM jobs GROUP BY state")
                    .unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    #[test]
    fn three_instances_run_every_job_once_survive_a_kill_and_stream_each_others_events() {
        let Some(pg) = super::server() else {
            return;
        };
        let url = pg.database("three");
        let db = url.rsplit('/').next().unwrap().to_string();
        let llm = TestServer::start_with(Options {
            delay: Duration::from_millis(15),
            ..Options::default()
        });
        let env = env(&url, &llm);
        let acme = token(&env, "acme", &[]);
        let globex = token(&env, "globex", &[]);
        let mut servers: Vec<Option<Server>> = (0..3)
            .map(|_| Some(Server::start(&env, &[ARGS, &["--workers", "2"]].concat())))
            .collect();
        let addrs: Vec<String> = servers
            .iter()
            .map(|s| s.as_ref().unwrap().addr.clone())
            .collect();
        // A client on instance A follows the tenant's events.
        let watch_addr = addrs[0].clone();
        let watch_token = acme.clone();
        // It follows until it sees the last job (posted to B at the end) succeed.
        let last = Arc::new(AtomicU64::new(0));
        let wanted = last.clone();
        let watcher = std::thread::spawn(move || {
            sse_until(
                &watch_addr,
                "/v1/events",
                Some(&watch_token),
                None,
                |k, v| {
                    let want = wanted.load(Ordering::SeqCst);
                    k == "job.succeeded" && want != 0 && v["job"].as_u64() == Some(want)
                },
            )
        });
        std::thread::sleep(Duration::from_millis(300));

        const N: usize = 1000;
        let mut jobs = 0;
        let mut jobs_extra = 0usize;
        let mut held_by_c: Vec<u64> = Vec::new();
        for i in 0..N {
            // Instance C dies (kill -9) a third of the way, with jobs in hand: the model
            // slows down until C holds a running job, then C is killed.
            if i == N / 3 {
                llm.set_delay(Duration::from_millis(3000));
                let c = servers[2].take().unwrap();
                let pid = c.pid();
                let held = format!(
                    "SELECT string_agg(id::text, ',') FROM jobs WHERE state = 'running' AND lease_owner LIKE '%:{pid}'"
                );
                let deadline = Instant::now() + Duration::from_secs(90);
                let mut k = 0;
                loop {
                    if !pg.psql(&db, &held).unwrap().is_empty() {
                        break;
                    }
                    assert!(Instant::now() < deadline, "C never took a job");
                    let session = format!("k{k}");
                    post_messages(&c.addr, Some(&acme), &session, &four(&session)).expect(202);
                    jobs_extra += 1;
                    k += 1;
                    std::thread::sleep(Duration::from_millis(50));
                }
                std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status()
                    .unwrap();
                // What C held when it died: the rows still running under its lease (a job it
                // finished between the look and the kill is not among them).
                held_by_c = pg
                    .psql(&db, &held)
                    .unwrap()
                    .split(',')
                    .filter_map(|x| x.parse::<u64>().ok())
                    .collect();
                assert!(!held_by_c.is_empty(), "C died holding no job");
                drop(c);
                llm.set_delay(Duration::from_millis(15));
            }
            let alive: Vec<&String> = servers
                .iter()
                .zip(&addrs)
                .filter_map(|(s, a)| s.as_ref().map(|_| a))
                .collect();
            let addr = alive[i % alive.len()];
            let (tok, session) = if i % 10 == 9 {
                (&globex, format!("g{i}"))
            } else {
                (&acme, format!("s{i}"))
            };
            let r = post_messages(addr, Some(tok), &session, &four(&session)).expect(202);
            if !r["job"].is_null() {
                jobs += 1;
            }
        }
        assert!(!held_by_c.is_empty());
        assert_eq!(jobs, N, "every session queued a summary job");
        let n = N + jobs_extra;
        wait_idle(pg, &db, 600);

        // Every job succeeded exactly once: one summary row per session covering 1-4, every
        // message stored once, and no job run by two workers (only those C held were
        // attempted again).
        assert_eq!(
            pg.psql(&db, "SELECT state, count(*) FROM jobs GROUP BY state")
                .unwrap(),
            format!("succeeded|{n}")
        );
        assert_eq!(
            scalar(pg, &db, "SELECT count(*) FROM episodes"),
            4 * n as i64
        );
        assert_eq!(
            scalar(
                pg,
                &db,
                "SELECT count(*) FROM summaries WHERE first_episode = 1 AND last_episode = 4"
            ),
            n as i64
        );
        assert_eq!(scalar(pg, &db, "SELECT count(*) FROM summaries"), n as i64);
        // The jobs C held when it died finished on the others, on their second attempt;
        // no other job ran twice.
        let retried: Vec<u64> = pg
            .psql(&db, "SELECT id FROM jobs WHERE attempts > 1 ORDER BY id")
            .unwrap()
            .lines()
            .filter_map(|x| x.trim().parse().ok())
            .collect();
        for j in &held_by_c {
            assert!(
                retried.contains(j),
                "job {j} that C held was resumed: {retried:?}"
            );
        }
        // (C has two workers: a job it took between the look and the kill is the only other
        // that may run again.)
        assert!(
            retried.len() <= 2,
            "only the jobs instance C held run again: {retried:?}"
        );

        // The tenants stay apart on every instance.
        for a in addrs.iter().take(2) {
            assert_eq!(get(a, "/v1/sessions/g9/summaries", Some(&acme)).status, 404);
            assert_eq!(
                get(a, "/v1/sessions/s0/summaries", Some(&globex)).status,
                404
            );
            assert_eq!(get(a, "/v1/sessions/s1/summaries", Some(&acme)).status, 200);
        }

        // The client on A saw jobs that B (and C) ran, through to their success.
        let me = servers[0].as_ref().unwrap().pid().to_string();
        // End the watch: one more job, whose success is the last event wanted.
        let r = post_messages(&addrs[1], Some(&acme), "last", &four("last")).expect(202);
        let last_job = r["job"]["id"].as_u64().unwrap();
        last.store(last_job, Ordering::SeqCst);
        wait_idle(pg, &db, 60);
        let _ = request(&addrs[0], "GET", "/healthz", None, b"");
        // The watch ends at the last job's success (or its read times out after a minute,
        // which the checks below report).
        let events = watcher.join().unwrap();
        drop(servers);
        let ran_elsewhere: Vec<u64> = events
            .iter()
            .filter(|(k, v)| {
                k == "job.running"
                    && !v["data"]["worker"]
                        .as_str()
                        .unwrap_or("")
                        .ends_with(&format!(":{me}"))
            })
            .filter_map(|(_, v)| v["job"].as_u64())
            .collect();
        assert!(!ran_elsewhere.is_empty(), "no job ran on another instance");
        let succeeded: std::collections::BTreeSet<u64> = events
            .iter()
            .filter(|(k, _)| k == "job.succeeded")
            .filter_map(|(_, v)| v["job"].as_u64())
            .collect();
        let seen = ran_elsewhere
            .iter()
            .filter(|j| succeeded.contains(j))
            .count();
        assert!(
            seen * 10 >= ran_elsewhere.len() * 9,
            "A saw {seen} of {} jobs run elsewhere succeed",
            ran_elsewhere.len()
        );
        assert!(
            succeeded.contains(&last_job),
            "A never saw the last job, run on B, succeed"
        );
        // Only its own tenant's events reached the acme client.
        assert!(
            events
                .iter()
                .all(|(_, v)| v["session"].as_str().is_none_or(|s| !s.starts_with('g')))
        );
    }

    #[test]
    fn chain_and_cluster_rules_hold_with_writers_on_every_instance_at_once() {
        let Some(pg) = super::server() else {
            return;
        };
        let url = pg.database("stress3");
        let db = url.rsplit('/').next().unwrap().to_string();
        let env = crate::serve::extractive().with("ABRIDGE_DB", &url);
        let acme = token(&env, "acme", &[]);
        let servers: Vec<Server> = (0..3)
            .map(|_| Server::start(&env, &[ARGS, &["--workers", "2"]].concat()))
            .collect();
        let addrs: Vec<String> = servers.iter().map(|s| s.addr.clone()).collect();
        // Six clients, two per instance, write to the same three sessions and the same memory
        // scope at once.
        let clients: Vec<_> = (0..6)
            .map(|c| {
                let (addr, tok) = (addrs[c % 3].clone(), acme.clone());
                std::thread::spawn(move || {
                    for r in 0..15 {
                        let session = format!("shared{}", r % 3);
                        let ms: Vec<Value> = (0..2)
                            .map(|k| json!({
                                "id": format!("c{c}-r{r}-{k}"),
                                "role": if k == 0 { "user" } else { "assistant" },
                                "content": format!("client {c} round {r}: the deploy of service {k} moves to Friday."),
                            }))
                            .collect();
                        post_messages(&addr, Some(&tok), &session, &json!({ "messages": ms }))
                            .expect(202);
                        let m = json!({"id": format!("m{c}-{r}"), "user": "alice", "project": "web",
                            "environment": "prod", "type": "preference", "key": "editor",
                            "text": format!("Alice wants the editor theme dark, note {c}-{r}"), "importance": 0.5});
                        crate::serve::post(&addr, "/v1/memories", Some(&tok), &json!({ "memories": [m] }))
                            .expect(202);
                    }
                })
            })
            .collect();
        for c in clients {
            c.join().unwrap();
        }
        wait_idle(pg, &db, 120);
        // Every message once, ids dense, and each chain covers 1..n exactly once, in order.
        for i in 0..3 {
            let s = format!("acme\u{1f}shared{i}");
            let ids = pg
                .psql(&db, &format!("SELECT string_agg(id::text, ',' ORDER BY id) FROM episodes WHERE session = '{s}'"))
                .unwrap();
            let expect: Vec<String> = (1..=60).map(|n| n.to_string()).collect();
            assert_eq!(ids, expect.join(","), "{s}");
            let chain = pg
                .psql(&db, &format!("SELECT first_episode || '-' || last_episode FROM summaries WHERE session = '{s}' AND compacted_into IS NULL ORDER BY first_episode"))
                .unwrap();
            let mut next = 1;
            for row in chain.lines() {
                let (a, b) = row.split_once('-').unwrap();
                assert_eq!(a.parse::<u64>().unwrap(), next, "{s}: {chain}");
                next = b.parse::<u64>().unwrap() + 1;
            }
            assert!(next > 1, "{s} has a summary");
        }
        // Cluster member counts match their members; every memory is in one cluster.
        assert_eq!(
            scalar(
                pg,
                &db,
                "SELECT count(*) FROM clusters c WHERE c.members != (SELECT count(*) FROM memories m WHERE m.tenant = c.tenant AND m.cluster = c.id)"
            ),
            0
        );
        assert_eq!(scalar(pg, &db, "SELECT count(*) FROM memories"), 90);
        assert_eq!(
            scalar(pg, &db, "SELECT coalesce(sum(members), 0) FROM clusters"),
            90
        );
    }

    #[test]
    fn a_tenants_job_cap_holds_across_instances() {
        let Some(pg) = super::server() else {
            return;
        };
        let url = pg.database("cap");
        let db = url.rsplit('/').next().unwrap().to_string();
        let llm = TestServer::start_with(Options {
            delay: Duration::from_millis(120),
            ..Options::default()
        });
        let env = env(&url, &llm);
        let acme = token(&env, "acme", &[]);
        let servers: Vec<Server> = (0..3)
            .map(|_| {
                Server::start(
                    &env,
                    &[ARGS, &["--workers", "3", "--tenant-jobs", "1"]].concat(),
                )
            })
            .collect();
        for i in 0..12 {
            let addr = &servers[i % 3].addr;
            post_messages(addr, Some(&acme), &format!("c{i}"), &four(&format!("c{i}"))).expect(202);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut most = 0;
        loop {
            let running = scalar(pg, &db, "SELECT count(*) FROM jobs WHERE state = 'running'");
            most = most.max(running);
            if scalar(
                pg,
                &db,
                "SELECT count(*) FROM jobs WHERE state IN ('queued','running')",
            ) == 0
            {
                break;
            }
            assert!(Instant::now() < deadline, "jobs did not finish");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            most, 1,
            "acme may run one job at a time on all instances together"
        );
        assert_eq!(
            pg.psql(&db, "SELECT state, count(*) FROM jobs GROUP BY state")
                .unwrap(),
            "succeeded|12"
        );
    }
}

mod model_slots {
    use std::time::Duration;

    use abridge_test_llm::{Options, TestServer};

    use crate::serve::{Server, post_messages, token};

    #[test]
    fn a_tenants_model_requests_in_flight_are_bounded_across_instances() {
        let Some(pg) = super::server() else {
            return;
        };
        let url = pg.database("slots");
        let db = url.rsplit('/').next().unwrap().to_string();
        let delay = Duration::from_millis(250);
        let llm = TestServer::start_with(Options {
            delay,
            ..Options::default()
        });
        let env = super::instances::env(&url, &llm);
        let acme = token(&env, "acme", &[]);
        // Jobs may run side by side on every instance; model requests may not.
        let extra = [
            "--workers",
            "3",
            "--tenant-jobs",
            "3",
            "--tenant-model-requests",
            "1",
        ];
        let servers: Vec<Server> = (0..3)
            .map(|_| Server::start(&env, &[super::instances::ARGS, &extra].concat()))
            .collect();
        for i in 0..6 {
            let s = format!("m{i}");
            post_messages(
                &servers[i % 3].addr,
                Some(&acme),
                &s,
                &super::instances::four(&s),
            )
            .expect(202);
        }
        super::instances::wait_idle(pg, &db, 120);
        let mut at: Vec<u64> = llm.generations().iter().map(|r| r.at_ms).collect();
        at.sort();
        assert!(at.len() >= 6, "{at:?}");
        // Each request is in flight for the model's delay: one at a time means arrivals at
        // least that far apart (less a little for timers).
        let closest = at.windows(2).map(|w| w[1] - w[0]).min().unwrap();
        assert!(
            closest + 30 >= delay.as_millis() as u64,
            "two of acme's model requests were in flight at once ({closest} ms apart): {at:?}"
        );
        assert_eq!(
            pg.psql(&db, "SELECT state, count(*) FROM jobs GROUP BY state")
                .unwrap(),
            "succeeded|6"
        );
        // Every slot was given back.
        assert_eq!(
            pg.psql(&db, "SELECT count(*) FROM model_slots").unwrap(),
            "0"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgvector_recall_agrees_with_the_exact_scan() {
    let Some(srv) = server() else {
        return;
    };
    let has = srv
        .psql(
            "postgres",
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'",
        )
        .unwrap();
    if has != "1" {
        // CI builds pgvector from ../shared/vendor (see .ci/run) and requires this test.
        assert!(
            std::env::var_os("ABRIDGE_REQUIRE_PGVECTOR").is_none(),
            "ABRIDGE_REQUIRE_PGVECTOR is set but this PostgreSQL has no pgvector: build it from ../shared/vendor/pgvector-0.8.6.tar.gz (see .ci/run)"
        );
        eprintln!(
            "SKIPPED: pgvector is not installed on this PostgreSQL (Debian 12 does not package it; .ci/run builds it from ../shared/vendor); recall uses the exact scan, which the conformance suite proves"
        );
        return;
    }
    let (pg, url) = pg_store("ann").await.unwrap();
    let exact = SqliteStore::in_memory().unwrap();
    // Deterministic vectors in 16 dimensions, two tenants.
    let mut seed = 7u64;
    let mut next = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    };
    for i in 0..400 {
        let tenant = if i % 4 == 3 { "globex" } else { "acme" };
        let v: Vec<f32> = (0..16).map(|_| next()).collect();
        // Five keys: a filter on one leaves a fifth of the tenant's memories.
        let m = NewMemory {
            id: format!("m{i}"),
            scope: scope(&format!("k{}", i % 5)),
            text: format!("fact {i}"),
            importance: 0.5,
            tokens: 2,
            created_ms: i,
            model: "emb".into(),
            vector: v,
            cluster: None,
            fact_key: String::new(),
            replaces: None,
        };
        pg.put_memory(tenant, m.clone()).await.unwrap();
        exact.put_memory(tenant, m).await.unwrap();
    }
    let ids = |hits: Vec<abridge_engine::types::Hit>| -> Vec<String> {
        hits.into_iter()
            .filter(|h| h.kind == abridge_engine::types::HitKind::Memory)
            .map(|h| h.id)
            .collect()
    };
    let (mut agree, mut total) = (0, 0);
    for _ in 0..20 {
        let q: Vec<f32> = (0..16).map(|_| next()).collect();
        let a = ids(pg
            .search("acme", &q, "emb", &MemoryFilter::default(), 5)
            .await
            .unwrap());
        let b = ids(exact
            .search("acme", &q, "emb", &MemoryFilter::default(), 5)
            .await
            .unwrap());
        assert_eq!(a.len(), 5);
        total += b.len();
        agree += b.iter().filter(|id| a.contains(id)).count();
    }
    assert!(agree * 10 >= total * 9, "recall@5 {agree}/{total}");
    // With a filter the index cannot apply first: still the full k, and the same memories
    // as the exact scan (the index's answer is checked, and the exact scan answers when the
    // filter leaves the index short).
    let only = MemoryFilter {
        key: Some("k2".into()),
        ..MemoryFilter::default()
    };
    let (mut agree, mut total) = (0, 0);
    for _ in 0..20 {
        let q: Vec<f32> = (0..16).map(|_| next()).collect();
        let a = ids(pg.search("acme", &q, "emb", &only, 10).await.unwrap());
        let b = ids(exact.search("acme", &q, "emb", &only, 10).await.unwrap());
        assert_eq!(a.len(), 10, "a filter must not cut the results");
        total += b.len();
        agree += b.iter().filter(|id| a.contains(id)).count();
    }
    assert!(
        agree * 100 >= total * 95,
        "recall@10 with a filter {agree}/{total}"
    );
    let db = url.rsplit('/').next().unwrap();
    assert_eq!(
        srv.psql(
            db,
            "SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'memories_ann_%'"
        )
        .unwrap(),
        "1",
        "the model's vector index was made"
    );
}
