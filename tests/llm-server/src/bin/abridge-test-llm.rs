//! `abridge-test-llm`: run the deterministic test LLM server from the command line.
//!
//! ```text
//! abridge-test-llm [--port N] [--delay-ms N] [--models a,b] [--token-ratio R] [--num-ctx N]
//! ```
//! Prints `listening on http://127.0.0.1:PORT` and serves until killed. Loopback only.

use std::time::Duration;

use abridge_test_llm::{Options, TestServer};

fn main() {
    let mut opts = Options::default();
    let mut port = 0u16;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| fail(&format!("{a} needs a value")))
        };
        match a.as_str() {
            "--port" => {
                port = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--port takes a number"))
            }
            "--delay-ms" => {
                opts.delay = Duration::from_millis(
                    value()
                        .parse()
                        .unwrap_or_else(|_| fail("--delay-ms takes a number")),
                )
            }
            "--models" => opts.models = value().split(',').map(str::to_string).collect(),
            // The context length when a request names none (an agent host's long system
            // prompt needs more than the default).
            "--num-ctx" => {
                opts.default_num_ctx = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--num-ctx takes a number"))
            }
            "--token-ratio" => {
                opts.token_ratio = value()
                    .parse()
                    .unwrap_or_else(|_| fail("--token-ratio takes a number"))
            }
            "-h" | "--help" => {
                println!(
                    "usage: abridge-test-llm [--port N] [--delay-ms N] [--models a,b] [--token-ratio R] [--num-ctx N]"
                );
                return;
            }
            other => fail(&format!("unknown argument {other}; see --help")),
        }
    }
    let server = TestServer::bind(&format!("127.0.0.1:{port}"), opts)
        .unwrap_or_else(|e| fail(&format!("cannot listen on 127.0.0.1:{port}: {e}")));
    println!("listening on {}", server.url());
    loop {
        std::thread::park();
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("abridge-test-llm: {msg}");
    std::process::exit(2);
}
