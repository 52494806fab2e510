//! `abridge mcp`: the MCP server over standard input and output, for the local database
//! (`claude mcp add abridge -- abridge mcp`, Codex's `[mcp_servers.abridge]`). Only protocol
//! messages go to stdout; notes go to stderr.

use clap::Args;

use super::commands::choose_backend;
use super::{Exit, Failure, Settings};

#[derive(Args, Debug)]
pub struct McpArgs {}

pub async fn mcp_cmd(s: &Settings, _a: McpArgs) -> Result<(), Failure> {
    let backend = choose_backend(s).await?;
    let local = super::app::local(s, Some(&backend))?;
    // Memories the agent remembers belong to the folder it started the server in.
    let cwd = std::env::current_dir().ok();
    abridge_mcp::serve_stdio(local, cwd.as_deref())
        .await
        .map_err(|e| Failure::new(Exit::Internal, e))
}
