//! Reading transcripts: JSON lines, OpenAI messages, Claude Code session JSONL and ChatGPT
//! `conversations.json` (see ../shared/docs/transcript-formats.md).
//!
//! The parsing itself runs in the guest, inside the sandbox (the `transcripts` export of the
//! WIT): this module reads bytes (bounded by `--max-bytes`, whatever the source), feeds them
//! to the guest parser in chunks, and gathers its episodes per conversation. Both hosts, Rust
//! and JavaScript, therefore parse byte for byte alike.
//!
//! Parsing is all-or-nothing: a file with a malformed line is refused with its line number
//! before anything is stored (unless the caller asks to skip bad lines). The one exception
//! is a partial last line with no newline, which a live Claude Code session is still
//! writing: it is skipped with a warning.

use std::path::Path;

use crate::Pure;
use crate::runtime::{Abridge, TranscriptParser};
use crate::types::{NewEpisode, ParseBatch, ParseError, ParseOptions};

/// A transcript format: the WIT `transcripts.format` (JSON lines, OpenAI messages, Claude
/// Code, ChatGPT export).
pub use crate::types::TranscriptFormat as Format;

/// Parsing choices.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Keep tool calls and tool results as episodes (off: only dialogue).
    pub include_tools: bool,
    /// Skip malformed lines with a warning instead of refusing the file.
    pub skip_invalid: bool,
    /// Lines of the file before these bytes (a watcher reads from where it stopped), so line
    /// numbers in messages and in episode keys are the file's own whatever the read started.
    pub first_line: usize,
    /// Most messages the input may hold (0: no limit): one request's cost stays bounded.
    pub max_episodes: u64,
    /// How the caller names a format, in messages that ask for one (`None`: the command
    /// line's `--format`; the service says `?format=`).
    pub format_flag: Option<&'static str>,
    /// The messages arrive as they are read (a watched file's new lines): one without a time is
    /// dated by its arrival. Otherwise (a file imported whole) it stays undated: the import's
    /// clock is not when it was said.
    pub arrived: bool,
}

/// One conversation read from a file.
#[derive(Clone, Debug)]
pub struct Conversation {
    /// The conversation's own id (Claude Code `sessionId`, ChatGPT conversation id).
    pub id: Option<String>,
    /// A title, when the format carries one.
    pub title: Option<String>,
    /// Episodes in order; `tokens` is left 0 for the guest to fill in.
    pub episodes: Vec<NewEpisode>,
}

/// Episodes of one conversation completed by one read (streaming parse).
#[derive(Clone, Debug)]
pub struct Part {
    /// The conversation's position in the file as the parser counts it (0 for
    /// single-conversation formats).
    pub index: u32,
    /// Its own id, once known.
    pub id: Option<String>,
    /// Its title, once known.
    pub title: Option<String>,
    /// Its episodes completed by this read.
    pub episodes: Vec<NewEpisode>,
}

/// A parsed file.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// The format read.
    pub format: Format,
    /// Conversations (several only for ChatGPT exports).
    pub conversations: Vec<Conversation>,
    /// Lines skipped, and why.
    pub warnings: Vec<String>,
    /// Bytes read.
    pub bytes: u64,
}

/// Why a transcript could not be read. Each message says how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum TranscriptError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {cause} — check the path")]
    Io {
        /// File.
        path: String,
        /// Cause (in the message once: not a `source`, which a report would print again).
        cause: std::io::Error,
    },
    /// The file is over the size limit.
    #[error(
        "{path} is over the {limit}-byte limit (at least {size} bytes) — raise it with --max-bytes, or split the file"
    )]
    TooLarge {
        /// File.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The file is not UTF-8.
    #[error("{said}")]
    Utf8 {
        /// File.
        path: String,
        /// 1-based line.
        line: usize,
        /// Byte offset of the bad sequence.
        offset: usize,
        /// The message, worded by the guest (`transcripts.describe-error`).
        said: String,
    },
    /// A line or document is malformed.
    #[error("{said}")]
    Malformed {
        /// File.
        path: String,
        /// 1-based line (1 for whole-document formats).
        line: usize,
        /// What is wrong and how to fix it.
        message: String,
        /// The message, worded by the guest.
        said: String,
    },
    /// The sandboxed parser stopped (a fuel or memory limit, or a bug in it): the file is not
    /// read, nothing is stored.
    #[error(
        "{path}: the transcript parser stopped ({message}) — nothing was stored; check the file, or report it with the file attached"
    )]
    Sandbox {
        /// File.
        path: String,
        /// What stopped it.
        message: String,
    },
    /// The file holds nothing but white space.
    #[error("{said}")]
    EmptyFile {
        /// File.
        path: String,
        /// The message, worded by the guest.
        said: String,
    },
    /// The format could not be recognised.
    #[error("{said}")]
    UnknownFormat {
        /// File.
        path: String,
        /// The message, worded by the guest.
        said: String,
    },
    /// More messages than one import takes (see [`Options::max_episodes`]).
    #[error("{said}")]
    TooManyEpisodes {
        /// File.
        path: String,
        /// The limit.
        limit: u64,
        /// The message, worded by the guest.
        said: String,
    },
    /// No messages were found.
    #[error("{said}")]
    Empty {
        /// File.
        path: String,
        /// Format used.
        format: Format,
        /// The message, worded by the guest.
        said: String,
    },
}

/// Default size limit for one transcript file: 256 MiB.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// Bytes fed to the guest parser per call.
pub const FEED_BYTES: usize = 1 << 20;

/// Read and parse a file (`-` reads standard input) into memory, every conversation whole: for
/// callers that need them all at once (`abridge bench`). It reads in chunks and stops one byte
/// past `max_bytes` whatever the source (a FIFO, an endless stdin, a growing file); imports
/// that store what they read use [`scan`] and [`Stream`] instead and never hold the file.
pub async fn read_file(
    pure: &Pure,
    path: &Path,
    format: Option<Format>,
    opts: Options,
    max_bytes: u64,
) -> Result<Parsed, TranscriptError> {
    let name = path.display().to_string();
    let mut input = Input::open(path, max_bytes)?;
    let feeder = Feeder::open(&pure.engine, &name, format, opts, true).await?;
    let mut stream = Stream::over(feeder, &mut input, u64::MAX, max_bytes)?;
    while stream.next().await?.is_some() {}
    Ok(stream.feeder.parsed())
}

/// A transcript that is read twice — once to check it, once to store it — so that neither
/// pass holds more of it than one read ([`scan`], then [`Stream`]).
pub enum Input<'a> {
    /// A file, reopened for each pass (the second reads only the bytes the first checked).
    Path(&'a Path),
    /// Bytes already in memory (a request body, bounded by the server's body limit).
    Bytes(&'a [u8]),
    /// Standard input (or any stream), spooled to an unnamed temporary file that is gone when
    /// this is dropped.
    Spooled(std::fs::File),
}

impl<'a> Input<'a> {
    /// The file at `path` (`-` is standard input, spooled), refused when over `max_bytes`
    /// or a directory.
    pub fn open(path: &'a Path, max_bytes: u64) -> Result<Input<'a>, TranscriptError> {
        let name = path.display().to_string();
        let io = |cause| TranscriptError::Io {
            path: name.clone(),
            cause,
        };
        if name == "-" {
            return Self::spool(&name, &mut std::io::stdin().lock(), max_bytes);
        }
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(io(std::io::Error::other(
                "it is a directory, not a transcript file",
            )));
        }
        if meta.is_file() && meta.len() > max_bytes {
            return Err(TranscriptError::TooLarge {
                path: name,
                size: meta.len(),
                limit: max_bytes,
            });
        }
        if !meta.is_file() {
            // A FIFO or a device reads once: spool it.
            let mut f = std::fs::File::open(path).map_err(io)?;
            return Self::spool(&name, &mut f, max_bytes);
        }
        Ok(Input::Path(path))
    }

    /// Copy at most `max_bytes` of `r` to an unnamed temporary file (one byte more is
    /// [`TranscriptError::TooLarge`]); memory holds one copy buffer.
    pub fn spool(
        name: &str,
        r: &mut impl std::io::Read,
        max_bytes: u64,
    ) -> Result<Input<'a>, TranscriptError> {
        let io = |cause| TranscriptError::Io {
            path: name.to_string(),
            cause,
        };
        let mut f = tempfile::tempfile().map_err(io)?;
        let n = std::io::copy(
            &mut std::io::Read::take(&mut *r, max_bytes.saturating_add(1)),
            &mut f,
        )
        .map_err(io)?;
        if n > max_bytes {
            return Err(TranscriptError::TooLarge {
                path: name.to_string(),
                size: n,
                limit: max_bytes,
            });
        }
        Ok(Input::Spooled(f))
    }

    /// A reader from the start.
    fn reader(&mut self) -> std::io::Result<Box<dyn std::io::Read + Send + '_>> {
        Ok(match self {
            Input::Path(p) => Box::new(std::fs::File::open(p)?),
            Input::Bytes(b) => Box::new(*b),
            Input::Spooled(f) => {
                std::io::Seek::rewind(f)?;
                Box::new(&*f)
            }
        })
    }
}

/// One conversation of a checked transcript: what naming and planning need, without its
/// episodes.
#[derive(Clone, Debug)]
pub struct Outline {
    /// The parser's index of the conversation (see [`Part::index`]).
    pub index: u32,
    /// The conversation's own id (Claude Code `sessionId`, ChatGPT conversation id).
    pub id: Option<String>,
    /// A title, when the format carries one.
    pub title: Option<String>,
    /// Its episodes.
    pub episodes: u64,
}

/// A checked transcript ([`scan`]): every line parsed, nothing kept but the outline.
#[derive(Clone, Debug)]
pub struct Scanned {
    /// The format read.
    pub format: Format,
    /// Its conversations with episodes, in file order.
    pub conversations: Vec<Outline>,
    /// Lines skipped, and why.
    pub warnings: Vec<String>,
    /// Bytes read (the second pass reads these and no more).
    pub bytes: u64,
}

impl Scanned {
    /// The position in [`conversations`](Self::conversations) (sorted by index) of the
    /// parser's index.
    pub fn position(&self, index: u32) -> Option<usize> {
        self.conversations
            .binary_search_by_key(&index, |c| c.index)
            .ok()
    }
}

/// The first pass: parse the whole input in the sandbox, one read at a time, keeping only
/// each conversation's id, title and episode count. A malformed line (unless skipped), an
/// input over `max_bytes` or over `opts.max_episodes` episodes is refused here, before
/// anything is stored.
pub async fn scan(
    engine: &Abridge,
    name: &str,
    input: &mut Input<'_>,
    format: Option<Format>,
    opts: Options,
    max_bytes: u64,
) -> Result<Scanned, TranscriptError> {
    let feeder = Feeder::open(engine, name, format, opts, false).await?;
    let mut stream = Stream::over(feeder, input, u64::MAX, max_bytes)?;
    let mut seen: Vec<Outline> = Vec::new();
    while let Some(parts) = stream.next().await? {
        for p in parts {
            let o = match seen.iter_mut().rev().find(|o| o.index == p.index) {
                Some(o) => o,
                None => {
                    seen.push(Outline {
                        index: p.index,
                        id: None,
                        title: None,
                        episodes: 0,
                    });
                    seen.last_mut().expect("just pushed")
                }
            };
            o.id = p.id.or(o.id.take());
            o.title = p.title.or(o.title.take());
            o.episodes += p.episodes.len() as u64;
        }
    }
    let mut feeder = stream.feeder;
    seen.retain(|o| o.episodes > 0);
    seen.sort_by_key(|o| o.index);
    Ok(Scanned {
        format: feeder.format().unwrap_or(Format::Jsonl),
        conversations: seen,
        warnings: feeder.finish_warnings(),
        bytes: feeder.bytes,
    })
}

/// An input read one chunk at a time through the sandboxed parser: the one read loop of
/// [`scan`] (the first pass), the second pass over a scanned input ([`Stream::new`]) and
/// [`read_file`].
pub struct Stream<'i, 'e> {
    feeder: Feeder<'e>,
    reader: Box<dyn std::io::Read + Send + 'i>,
    /// Most bytes the input may hold: one more is [`TranscriptError::TooLarge`].
    max_bytes: u64,
    buf: Vec<u8>,
    ended: bool,
}

impl<'i, 'e> Stream<'i, 'e> {
    /// Read `input` again, in the format and up to the length `scanned` found.
    pub async fn new(
        engine: &'e Abridge,
        name: &str,
        input: &'i mut Input<'_>,
        scanned: &Scanned,
        opts: Options,
    ) -> Result<Stream<'i, 'e>, TranscriptError> {
        let feeder = Feeder::open(engine, name, Some(scanned.format), opts, false).await?;
        Self::over(feeder, input, scanned.bytes, u64::MAX)
    }

    /// `input` from its start through `feeder`, reading at most `take` bytes and refusing
    /// more than `max_bytes`.
    fn over(
        feeder: Feeder<'e>,
        input: &'i mut Input<'_>,
        take: u64,
        max_bytes: u64,
    ) -> Result<Stream<'i, 'e>, TranscriptError> {
        let reader = input.reader().map_err(|cause| TranscriptError::Io {
            path: feeder.name.clone(),
            cause,
        })?;
        Ok(Stream {
            feeder,
            reader: Box::new(std::io::Read::take(reader, take)),
            max_bytes,
            buf: vec![0u8; FEED_BYTES],
            ended: false,
        })
    }

    /// The parts completed by the next read; `None` once the input is done. (In a second
    /// pass, an error means the file changed since it was checked.)
    pub async fn next(&mut self) -> Result<Option<Vec<Part>>, TranscriptError> {
        if self.ended {
            return Ok(None);
        }
        loop {
            match self.reader.read(&mut self.buf) {
                Ok(0) => {
                    self.ended = true;
                    self.feeder.end().await?;
                    return Ok(Some(self.feeder.drain_parts()));
                }
                Ok(n) => {
                    let size = self.feeder.bytes + n as u64;
                    if size > self.max_bytes {
                        return Err(TranscriptError::TooLarge {
                            path: self.feeder.name.clone(),
                            size,
                            limit: self.max_bytes,
                        });
                    }
                    self.feeder.feed(&self.buf[..n]).await?;
                    return Ok(Some(self.feeder.drain_parts()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(TranscriptError::Io {
                        path: self.feeder.name.clone(),
                        cause: e,
                    });
                }
            }
        }
    }
}

/// The second pass: store the episodes of a [`scan`]ned input through `engine`, conversation
/// `i` of `scanned` into `sessions[i]` (an empty name leaves it out), one read at a time.
/// Returns the episodes new to each session. (The app's import, backfill, and the command
/// line's dry runs, into their in-memory stores.)
pub async fn store(
    engine: &Abridge,
    name: &str,
    input: &mut Input<'_>,
    scanned: &Scanned,
    sessions: &[String],
    opts: Options,
) -> Result<Vec<u32>, crate::AppError> {
    debug_assert_eq!(sessions.len(), scanned.conversations.len());
    let mut added = vec![0u32; sessions.len()];
    let mut stream = Stream::new(engine, name, input, scanned, opts).await?;
    while let Some(parts) = stream.next().await? {
        for p in parts {
            // An empty session name leaves its conversation out.
            if let Some(i) = scanned
                .position(p.index)
                .filter(|&i| !p.episodes.is_empty() && !sessions[i].is_empty())
            {
                added[i] += if opts.arrived {
                    engine.append(&sessions[i], &p.episodes).await?
                } else {
                    engine.append_imported(&sessions[i], &p.episodes).await?
                };
            }
        }
    }
    Ok(added)
}

/// Parse bytes named `name` (used in messages).
pub async fn parse_bytes(
    pure: &Pure,
    name: &str,
    bytes: &[u8],
    format: Option<Format>,
    opts: Options,
) -> Result<Parsed, TranscriptError> {
    let mut feeder = Feeder::open(&pure.engine, name, format, opts, true).await?;
    for chunk in bytes.chunks(FEED_BYTES) {
        feeder.feed(chunk).await?;
    }
    feeder.finish().await
}

/// Feeds a file to the guest parser and keeps what it yields: whole conversations as the
/// guest completes them ([`new`](Self::new)), or episodes as they complete
/// ([`streaming`](Self::streaming)). The guest groups episodes into conversations; the
/// host only collects them.
pub struct Feeder<'a> {
    engine: &'a Abridge,
    parser: TranscriptParser<'a>,
    name: String,
    format: Option<Format>,
    format_flag: &'static str,
    conversations: Vec<Conversation>,
    /// Streaming: the conversations' episodes completed since the last
    /// [`drain`](Self::drain).
    parts: Vec<Part>,
    streaming: bool,
    warnings: Vec<String>,
    /// Bytes fed so far.
    pub bytes: u64,
}

impl<'a> Feeder<'a> {
    /// A parser for the file `name` that yields whole conversations.
    pub async fn new(
        pure: &'a Pure,
        name: &str,
        format: Option<Format>,
        opts: Options,
    ) -> Result<Feeder<'a>, TranscriptError> {
        Self::open(&pure.engine, name, format, opts, true).await
    }

    /// A parser for the file `name` whose episodes are taken as they complete
    /// ([`drain`](Self::drain)), for a caller that stores them as they come.
    pub async fn streaming(
        pure: &'a Pure,
        name: &str,
        format: Option<Format>,
        opts: Options,
    ) -> Result<Feeder<'a>, TranscriptError> {
        Self::open(&pure.engine, name, format, opts, false).await
    }

    pub(crate) async fn open(
        engine: &'a Abridge,
        name: &str,
        format: Option<Format>,
        opts: Options,
        whole: bool,
    ) -> Result<Feeder<'a>, TranscriptError> {
        let parser = engine
            .parser(&ParseOptions {
                format,
                include_tools: opts.include_tools,
                skip_invalid: opts.skip_invalid,
                first_line: opts.first_line.min(u32::MAX as usize) as u32,
                name: name.to_string(),
                max_episode_bytes: 0,
                whole,
                max_episodes: opts.max_episodes,
            })
            .await
            .map_err(|e| sandbox(name, e))?;
        Ok(Feeder {
            engine,
            parser,
            name: name.to_string(),
            format,
            format_flag: opts.format_flag.unwrap_or("--format"),
            conversations: Vec::new(),
            parts: Vec::new(),
            streaming: !whole,
            warnings: Vec::new(),
            bytes: 0,
        })
    }

    /// Parse the next bytes.
    pub async fn feed(&mut self, chunk: &[u8]) -> Result<(), TranscriptError> {
        self.bytes += chunk.len() as u64;
        let r = self
            .parser
            .feed(chunk)
            .await
            .map_err(|e| sandbox(&self.name, e))?;
        self.take(r).await
    }

    /// End of input: everything parsed.
    pub async fn finish(mut self) -> Result<Parsed, TranscriptError> {
        self.end().await?;
        Ok(self.parsed())
    }

    /// What a feeder that has [`end`](Self::end)ed gathered.
    fn parsed(self) -> Parsed {
        // The guest refuses a file without messages (`no-messages`) and never delivers an
        // empty conversation.
        Parsed {
            format: self.format.unwrap_or(Format::Jsonl),
            conversations: self.conversations,
            warnings: self.warnings,
            bytes: self.bytes,
        }
    }

    /// End of input, keeping the feeder: the last episodes are [`drain`](Self::drain)ed
    /// after it.
    pub async fn end(&mut self) -> Result<(), TranscriptError> {
        let r = self
            .parser
            .finish()
            .await
            .map_err(|e| sandbox(&self.name, e))?;
        self.take(r).await
    }

    /// The format read (once known).
    pub fn format(&self) -> Option<Format> {
        self.format
    }

    /// The warnings gathered so far (skipped lines), taken out of the feeder.
    pub fn finish_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Take the episodes completed so far out of a [`streaming`](Self::streaming) feeder.
    pub fn drain(&mut self) -> Vec<NewEpisode> {
        std::mem::take(&mut self.parts)
            .into_iter()
            .flat_map(|p| p.episodes)
            .collect()
    }

    /// Take the conversations' episodes completed so far out of a
    /// [`streaming`](Self::streaming) feeder, each with its conversation.
    pub fn drain_parts(&mut self) -> Vec<Part> {
        std::mem::take(&mut self.parts)
    }

    async fn take(&mut self, r: Result<ParseBatch, ParseError>) -> Result<(), TranscriptError> {
        let b = match r {
            Ok(b) => b,
            Err(e) => {
                return Err(
                    parse_error(self.engine, &self.name, self.format, self.format_flag, e).await,
                );
            }
        };
        if let Some(f) = b.format {
            self.format = Some(f);
        }
        self.warnings.extend(b.warnings);
        for part in b.conversations {
            // The fields a transcript gives; the rest (tokens, terms) the guest fills in.
            let episodes = part.episodes.into_iter().map(|e| NewEpisode {
                item: e.item,
                role: e.role,
                content: e.content,
                timestamp_ms: e.timestamp_ms,
                source_key: e.source_key,
                speaker: e.speaker,
                ..Default::default()
            });
            if self.streaming {
                self.parts.push(Part {
                    index: part.index,
                    id: part.id,
                    title: part.title,
                    episodes: episodes.collect(),
                });
            } else {
                self.conversations.push(Conversation {
                    id: part.id,
                    title: part.title,
                    episodes: episodes.collect(),
                });
            }
        }
        Ok(())
    }
}

fn sandbox(name: &str, e: crate::runtime::CallError) -> TranscriptError {
    TranscriptError::Sandbox {
        path: name.to_string(),
        message: e.to_string(),
    }
}

/// The typed error for a parse error, with the guest's wording (`format_flag` is how the
/// caller names a format: `--format` on the command line, `?format=` over HTTP).
async fn parse_error(
    engine: &Abridge,
    name: &str,
    format: Option<Format>,
    format_flag: &str,
    e: ParseError,
) -> TranscriptError {
    let path = name.to_string();
    // A format the caller named is the one reported.
    let e = match e {
        ParseError::NoMessages(f) => ParseError::NoMessages(format.unwrap_or(f)),
        other => other,
    };
    let said = match engine.describe_parse_error(name, &e, format_flag).await {
        Ok(s) => s,
        Err(c) => return sandbox(name, c),
    };
    match e {
        ParseError::InvalidUtf8((line, offset)) => TranscriptError::Utf8 {
            path,
            line: line as usize,
            offset: offset as usize,
            said,
        },
        ParseError::Malformed((line, message)) => TranscriptError::Malformed {
            path,
            line: line as usize,
            message,
            said,
        },
        ParseError::UnknownFormat => TranscriptError::UnknownFormat { path, said },
        ParseError::EmptyFile => TranscriptError::EmptyFile { path, said },
        ParseError::NoMessages(format) => TranscriptError::Empty { path, format, said },
        ParseError::TooManyEpisodes(limit) => {
            TranscriptError::TooManyEpisodes { path, limit, said }
        }
    }
}
