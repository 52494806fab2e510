// Public API of @abridge/engine. Plain numbers instead of WIT u64 BigInts, Promises for
// every call, and AbridgeError instead of `{tag, val}` results. The raw generated bindings
// are in dist/guest/abridge.d.ts.

export type Role = 'system' | 'user' | 'assistant' | 'tool';
export type ErrorKind =
  | 'unreachable' | 'model-not-found' | 'timeout' | 'context-overflow'
  | 'server' | 'rejected-output' | 'storage' | 'conflict' | 'invalid-input';

/** An actionable engine error; `message` says what happened and how to fix it. */
export class AbridgeError extends Error {
  constructor(kind: ErrorKind, message: string);
  readonly kind: ErrorKind;
  /** The payload without the kind's prefix. */
  readonly detail: string;
}

export interface Message { role: Role; content: string }

/** An episode to append. `sourceKey` makes appends idempotent (a known key is skipped). */
/** `speaker`: the speaker's name when the transcript gives one (summaries attribute to it).
 * `item`: the client's own record of the message (JSON text, or a value kept as its JSON),
 * stored beside it and handed back as given. */
export interface NewEpisode { role: Role; content: string; timestampMs?: number; sourceKey: string | number; speaker?: string; item?: unknown }

export interface StoredNewEpisode {
  role: Role; content: string; timestampMs?: number; sourceKey: string; tokens: number; speaker?: string;
  /** The episode's full-text index terms, space separated (filled in by the guest). */
  terms: string;
  /** The client's own record of the message (JSON text): a store keeps it beside the episode. */
  item?: string;
}

/** What a store's full-text index answers for a query's terms (the WIT `term-matches`). */
export interface TermMatches {
  docs: number;
  length: number;
  df: number[];
  matches: Array<{ session: string; episode: number; length: number; counts: number[] }>;
}

/** One message a search found. */
export interface SearchHit {
  session: string;
  episode: number;
  role: Role;
  speaker?: string;
  timestampMs?: number;
  /** The whole message. */
  content: string;
  /** BM25 score (higher is better). */
  score: number;
  /** The text around the matches, each matching word between `**`. */
  excerpt: string;
}
export interface Episode {
  id: number; role: Role; content: string; timestampMs?: number; tokens: number; speaker?: string;
  /** Sum of `tokens` over the session's episodes 1..=id (kept by the store). */
  tokensThrough: number;
}
export interface SessionStats { episodes: number; totalTokens: number; lastEpisode: number }

export interface SummaryRow {
  id: number;
  /** First episode covered (inclusive). */
  firstEpisode: number;
  /** Last episode covered (inclusive). */
  lastEpisode: number;
  content: string;
  tokens: number;
  promptTokens: number;
  outputTokens: number;
  model: string;
  createdMs: number;
  updatedMs: number;
  /** Episode ranges [first, last] the content does not reflect (failed map chunks). */
  skipped: Array<[number, number]>;
  /** 0 for a summary of episodes; n + 1 for an "earlier" row compacting rows of level n. */
  level: number;
  /** The row that compacted this one, if any (it then left the active chain). */
  compactedInto?: number;
  /** The facts ledger: identifiers kept verbatim, with the episode each was last seen in. */
  ledger: LedgerEntry[];
  /** Ledger entries the budget dropped so far. */
  ledgerDropped: number;
}

export interface LedgerEntry {
  text: string;
  kind: 'path' | 'url' | 'command' | 'code' | 'number' | 'version' | 'date' | 'email' | 'ticket' | 'name' | 'request' | 'created' | 'edited' | 'read' | 'ran' | 'failed' | 'todo' | 'fact';
  episode: number;
  count: number;
}

/** A person's fact on its time line: every value it had and how it ended, if it did. */
export interface Fact {
  who: string;
  key: string;
  /** The value that holds now; undefined when the fact ended. */
  current?: string;
  values: Array<{ value: string; fromMs?: number; episode: number }>;
  ended?: { atMs?: number; episode: number; sentence: string };
  /** The fact as a context shows it. */
  line: string;
}

export interface Expansion {
  row: SummaryRow;
  /** The episodes the row covers, in order (one page), or the identifier's episode. */
  episodes: Episode[];
  /** The rows an "earlier" row compacted, oldest first. */
  compacted: SummaryRow[];
  /** Pass as `after` for the next page, when the page was cut. */
  nextAfter?: number;
}

export interface SummaryWrite {
  replaces?: number;
  firstEpisode: number;
  lastEpisode: number;
  content: string;
  tokens: number;
  promptTokens: number;
  outputTokens: number;
  model: string;
  nowMs: number;
  skipped: Array<[number, number]>;
}

/** Engine settings; every field defaults to `defaultConfig`. */
export interface Config {
  engine: 'llm' | 'extractive';
  rendering: 'chat' | 'chatml';
  model: string;
  contextLength: number;
  maxOutputTokens: number;
  temperature: number;
  thresholdTokens: number;
  minEpisodesSince: number;
  maxSummaryTokens: number;
  /** Map-reduce fails instead of summarizing when more than this % of chunks fail (default 50). */
  maxSkippedPercent: number;
  /** Map-reduce: cap on a chunk's estimated tokens; 0 derives it from the context (default). */
  chunkTokens: number;
  /** When automatic refreshes summarize (default 'window'). */
  mode: 'eager' | 'idle' | 'window';
  /** Idle mode: quiet seconds after the last message's own timestamp (default 3600). */
  quiescenceSecs: number;
  /** Idle mode: unsummarized tokens that earn an active conversation a provisional summary; 0 off (default). */
  provisionalTokens: number;
  /** Automatic refreshes stop after this many failures in a row (default 5). */
  maxAttempts: number;
  /** First backoff after a failed refresh, seconds, doubled per failure (default 60). */
  retryBaseSecs: number;
  /** Unsummarized tokens due whatever their count (default 1000). */
  maxBacklogTokens: number;
  /** Over this many tokens of rows, the oldest are compacted into an "earlier" row (default 1200). */
  summaryBudgetTokens: number;
  /** The facts ledger's budget; 0 off (default 300). */
  ledgerTokens: number;
  /** Window mode: newest messages never folded (default 8). */
  windowMessages: number;
  /** Instructions added to every fold prompt (default ''). */
  focus: string;
}
export const defaultConfig: Readonly<Config>;

/** Why automatic refreshes are held back: the last refresh failed. */
export interface FailureMarker { failures: number; lastError: string; retryAfterMs: number; failedMs: number }

export interface Freshness {
  state: 'empty' | 'fresh' | 'waiting' | 'due' | 'backing-off' | 'gave-up';
  reason: string;
  episodes: number;
  covered: number;
  backlogTokens: number;
  lastActivityMs?: number;
  coveredUntilMs?: number;
  dueAtMs?: number;
  failures: number;
  lastError?: string;
  /** The episode a refresh now folds up to: the newest, or in window mode the newest that has left the window. */
  foldUpto: number;
  /** Active rows the offline summarizer wrote that the configured model rewrites on the next refresh (0 without a model). */
  fallbackRows: number;
}

export interface ContextRequest {
  budget: number;
  pairs: number;
  refreshAfter: number;
  /** Episodes always included verbatim, within the budget. */
  pins: number[];
  /** What the next call is about (usually the user's newest message): the earlier turns that
   * best match it are included verbatim beside the summary. */
  query?: string;
  /** When set, the window carries the refresh verdict of a context that keeps at most this
   * many messages beyond the summary (`verdict`, `behind`), from the same call. */
  verdictAfter?: number;
}
export const defaultContextRequest: Readonly<ContextRequest>;

export interface ContextWindow {
  messages: Message[];
  tokens: number;
  fullTokens: number;
  covered: number;
  recent: number;
  omitted: number;
  refreshed: boolean;
  refreshDue: boolean;
  /** The highest summary level used. */
  level: number;
  /** The first episode the context reflects (1: the whole conversation). */
  coveredFrom: number;
  /** Episode ranges [first, last] left out; empty when everything is covered. */
  omittedRanges: Array<[number, number]>;
  /** Ledger identifiers included. */
  identifiers: number;
  /** Pinned episodes included. */
  pinned: number;
  /** Earlier turns included because they match the query (their short replies included). */
  found: number;
  /** The budget it was built for (`tokens` is at most this). */
  budget: number;
  /** The estimated tokens of each part; they add up to `tokens`. */
  parts: ContextParts;
  /** The episode each message after the system message is (pinned and recent, oldest first). */
  shown: number[];
  /** The leading messages every later context begins with, byte for byte, until the next
   * fold: put a prompt cache's breakpoint at the end of them. */
  stable: StablePrefix;
  /** The per-call part the newest message carries before its own text (the turns a query
   * found, a coding session's digest, what unshown newer turns say), given apart. */
  note?: string;
  /** The refresh verdict `verdictAfter` asked for. */
  verdict?: Freshness;
  /** More messages lie beyond the summary than `verdictAfter` allows (due yet or not). */
  behind: boolean;
}

/** The stable prefix of a context window. */
export interface StablePrefix {
  /** How many leading messages stay the same until the next fold. */
  messages: number;
  /** Their contents' characters (Unicode scalar values), added up. */
  chars: number;
}

/** The estimated tokens of each part of a context window (message costs included). */
export interface ContextParts {
  /** The summary's text: its rows, or the chosen lines of an offline summary. */
  summary: number;
  /** The ledger of identifiers beside it. */
  ledger: number;
  /** A coding session's digest. */
  digest: number;
  /** Pinned episodes. */
  pinned: number;
  /** Recent turns, verbatim. */
  recent: number;
  /** The day marks before the turns that open a new day. */
  days: number;
  /** The earlier turns the query found. */
  found: number;
}

export interface PlanReport {
  path: 'nothing' | 'single' | 'rolling' | 'map-reduce';
  episodes: number;
  backlogTokens: number;
  /** Map chunks (exact), or passes. */
  chunks: number;
  /** Reduce calls per level (an upper bound). */
  levels: number[];
  calls: number;
  inputTokens: number;
  outputTokens: number;
}

export interface Outcome { triggered: boolean; passes: number; written: SummaryRow[]; unsummarized: number }

/** A model request as the guest builds it. */
export interface LlmRequest {
  model: string;
  prompt: { tag: 'chat'; val: Message[] } | { tag: 'raw'; val: string };
  temperature: number;
  maxOutputTokens: number;
  contextLength: number;
  stop: string[];
  /** Set on map and reduce requests; the engine caches the complete answer under it. */
  cacheKey?: string;
}
export interface LlmResponse { text: string; finishReason: 'stop' | 'length' | 'other'; promptTokens?: number; outputTokens?: number }

/** A model backend: reject with AbridgeError for failures the engine should report. */
export interface LlmBackend { name: string; generate(req: LlmRequest): Promise<LlmResponse> }

/** A store; methods are synchronous. Throw AbridgeError('storage', …) on failure. */
export interface Store {
  appendEpisodes(session: string, episodes: StoredNewEpisode[]): number;
  stats(session: string): SessionStats;
  episodesAfter(session: string, after: number, limit: number): Episode[];
  /** The episodes with these ids, ascending (an id the session does not hold left out);
   * optional: a store without it is read an episode at a time. */
  episodes?(session: string, ids: number[]): Episode[];
  latestSummary(session: string): SummaryRow | undefined;
  summaries(session: string): SummaryRow[];
    writeSummary(session: string, write: SummaryWrite): SummaryRow;
  sessions(): string[];
  /** Calibration totals of the token estimator for a model. */
  calibration(model: string): { estimated: number; reported: number } | undefined;
  recordCalibration(model: string, estimated: number, reported: number): void;
  /** Model answers of map-reduce by request key, with the tokens they cost. */
  partial(key: string): CachedAnswer | undefined;
  putPartial(key: string, answer: CachedAnswer): void;
  failure(session: string): FailureMarker | undefined;
  setFailure(session: string, marker: FailureMarker | undefined): void;
  resetSession(session: string): void;
  /** The full-text index's episodes holding any of `terms` (in `session`, or every session);
   * optional: a store without it cannot search. */
  searchEpisodes?(session: string | undefined, terms: string[], limit: number): TermMatches;
}

/** Retries of transient failures (timeouts, connection errors, 429/5xx, unparseable answers). */
export interface RetryPolicy { attempts: number; baseMs: number; maxMs: number }
export const defaultRetry: Readonly<RetryPolicy>;
export function ollama(options?: { url?: string; timeoutMs?: number; retry?: RetryPolicy }): LlmBackend;
export function openai(options: { baseUrl: string; apiKey?: string; timeoutMs?: number; retry?: RetryPolicy }): LlmBackend;
export const noModel: LlmBackend;

/** SQLite through node:sqlite, with the Rust host's schema (the two can share a file);
 * `SqliteStore.open(':memory:')` keeps a database in memory, gone with the process. */
export interface SqliteStore extends Store {}
export class SqliteStore {
  /** `masterKey`: 64 hex digits (the Rust host's ABRIDGE_MASTER_KEY_FILE) to seal memory text at rest. */
  static open(path: string, options?: { masterKey?: string; sealVectors?: boolean }): Promise<SqliteStore>;
  /** The items (the clients' own records) stored with episodes `ids` of `session`, by id;
   * those stored without one are absent. */
  items(session: string, ids: number[]): Map<number, string>;
  close(): void;
}

export function checkChain(session: string, episodes: number, prev: SummaryRow | undefined, target: { first: number; last: number } | undefined, write: SummaryWrite): void;
export function describe(kind: ErrorKind, message: string): string;

export interface EngineOptions {
  /** Default: a SQLite database in memory (`await SqliteStore.open(':memory:')`). */
  store?: Store;
  llm?: LlmBackend;
  /** Milliseconds since the epoch; default Date.now. */
  clock?: () => number;
  log?: (level: 'debug' | 'info' | 'warn', message: string) => void;
  /** Progress of a map-reduce stage (level 0: map; 1 and up: reduce levels). */
  onProgress?: (p: { level: number; done: number; total: number }) => void;
  /** What a summarize call is about to do: once before its first model call, again if it re-plans. */
  onPlan?: (plan: PlanReport) => void;
  /** Most batch requests in flight at once; default 6. */
  batchConcurrency?: number;
  /** An embedding backend for memory embedders other than the offline `abridge-lexical-v1`. */
  embedder?: Embedder;
  /** Guards for cluster summaries: at most `clusterJobs` at once (default 3), and a monthly ceiling. */
  limits?: { clusterJobs?: number; ceiling?: { tokens?: number; cost?: number; priceInput?: number; priceOutput?: number } };
}

/** A model answer kept in the partial cache. */
export interface CachedAnswer {
  text: string;
  promptTokens: number;
  outputTokens: number;
}

/** A transcript format. */
export type TranscriptFormat = 'jsonl' | 'openai' | 'claude-code' | 'chatgpt' | 'codex';

/** How to parse a transcript (see the WIT `transcripts.parse-options`). */
export interface ParseOptions {
  /** The format; default: detect it from the content. */
  format?: TranscriptFormat;
  /** Keep tool calls and tool results as episodes. */
  includeTools?: boolean;
  /** Skip malformed lines (and lines that are not UTF-8) with a warning instead of failing. */
  skipInvalid?: boolean;
  /** Lines of the file before the first byte given (resuming mid-file). */
  firstLine?: number;
  /** The file's name, for messages. */
  name?: string;
  /** Longest episode in bytes; longer messages are split into parts (default 65,536). */
  maxEpisodeBytes?: number;
}

/** A parsed transcript: conversations (several for a ChatGPT export) ready for `append`. */
export interface ParsedTranscript {
  format: TranscriptFormat;
  conversations: { index: number; id?: string; title?: string; episodes: NewEpisode[] }[];
  warnings: string[];
}

/** Where a memory belongs: it clusters only with memories of the same five fields. */
export interface MemoryScope { user: string; project?: string; environment?: string; kind: string; key: string }
/** A memory to write. `replaces` names a memory of the same scope it replaces; without it, a
 * fact that changes ("I moved to Lyon" after "I live in Porto") replaces the earlier one. */
export interface MemoryInput { id?: string; scope: MemoryScope; text: string; importance?: number; replaces?: string }
export interface MemoryConfig { embedder: string; minSimilarity: number; minClusterItems: number; summaryMinSimilarity: number; promptBudget: number }
export const defaultMemoryConfig: Readonly<MemoryConfig>;
/** A stored memory: `supersedes` the memory it replaced, `supersededBy` the one that replaced
 * it (no longer current) and `supersededMs` when (0 while current). */
export interface StoredMemory { id: string; scope: MemoryScope; text: string; importance: number; tokens: number; createdMs: number; cluster: number; seq: number; supersedes?: string; supersededBy?: string; supersededMs: number }
/** `supersedes`: the memory it replaced (kept, marked with this one). */
export interface Remembered { id: string; cluster: number; created: boolean; members: number; due: boolean; supersedes?: string }
export interface ClusterSummary {
  /** It covers the cluster's members with `seq <= coveredSeq`, `covered` of them (`summarySources` lists them). */
  id: number; cluster: number; text: string; memberHash: string; coveredSeq: number; covered: number; importance: number; tokens: number;
  model: string; calls: number; promptTokens: number; outputTokens: number; createdMs: number; updatedMs: number;
}
export interface ClusterOutcome {
  action: 'unchanged' | 'created' | 'refreshed' | 'deleted' | 'too-few' | 'lost-race';
  summary?: ClusterSummary; calls: number; promptTokens: number; outputTokens: number;
}
export interface MemoryFilter { user?: string; project?: string; environment?: string; kind?: string; key?: string; /** Exact scan instead of an index (the JS stores always scan exactly). */ exact?: boolean }
/** `supersededBy`: the memory that replaced it (it is no longer current, and the current one
 * comes before it); `supersededMs`: when (0 while current). */
export interface Recalled { kind: 'memory' | 'summary'; id: string; text: string; score: number; similarity: number; importance: number; cluster: number; sources: string[]; supersededBy?: string; supersededMs: number }
export interface Embedder { embed(texts: string[]): Promise<{ model: string; dim: number; vectors: number[][]; tokens?: number }> }

export class Engine {
  readonly llmName: string;
  /** Store memories, each in its cluster; due clusters are summarized with summarizeCluster. */
  remember(items: MemoryInput[], memoryConfig?: Partial<MemoryConfig>): Promise<Remembered[]>;
  summarizeCluster(cluster: number, config?: Partial<Config>, memoryConfig?: Partial<MemoryConfig>): Promise<ClusterOutcome>;
  forget(id: string, memoryConfig?: Partial<MemoryConfig>): Promise<{ cluster: number; summaryDeleted: boolean; due: boolean } | undefined>;
  recall(query: string, filter?: MemoryFilter, k?: number, memoryConfig?: Partial<MemoryConfig>): Promise<Recalled[]>;
  memory(id: string): StoredMemory | undefined;
  memories(filter?: MemoryFilter, page?: { offset?: number; limit?: number }): StoredMemory[];
  /** The ids of the memories a cluster summary covers, oldest first. */
  summarySources(summary: ClusterSummary): string[];
  clusters(): { id: number; scope: MemoryScope; members: string[]; summary?: number; note?: string }[];
  embedLexical(texts: string[]): Promise<number[][]>;
  /** This month's usage for cluster summaries against the ceiling. */
  usage(): { month: string; calls: number; promptTokens: number; outputTokens: number; cost: number; limitTokens?: number; limitCost?: number; exhausted: boolean; resetsAtMs: number; days: { day: string; calls: number; promptTokens: number; outputTokens: number; cost: number }[] };
  /** Parse a transcript inside the sandbox (the same parser as the Rust host). */
  parseTranscript(
    source: Uint8Array | string | Iterable<Uint8Array> | AsyncIterable<Uint8Array>,
    options?: ParseOptions,
  ): Promise<ParsedTranscript>;
  readonly store: Store;
  append(session: string, episodes: NewEpisode[]): Promise<number>;
  /** `append` for an imported transcript: an episode without a timestamp stays undated. */
  appendImported(session: string, episodes: NewEpisode[]): Promise<number>;
  afterEpisodeWritten(session: string, config?: Partial<Config>): Promise<Outcome>;
  summarizeNow(session: string, config?: Partial<Config>): Promise<Outcome>;
  chain(session: string): Promise<SummaryRow[]>;
  /** Every row, compacted ones included. */
  history(session: string): Promise<SummaryRow[]>;
  /** Provenance: a row and exactly the episodes it covers, or a ledger entry's episode. */
  expand(session: string, row: number, options?: { identifier?: string; after?: number; limit?: number }): Promise<Expansion>;
  /** The session's facts as they stand, the facts changed most recently first. */
  facts(session: string): Promise<Fact[]>;
  /** The identifiers the facts ledger takes from a text. */
  identifiers(text: string): Promise<Array<{ text: string; kind: LedgerEntry['kind'] }>>;
  /** What summarizeNow would do, without calling the model or writing. */
  plan(session: string, config?: Partial<Config>): Promise<PlanReport>;
  freshness(session: string, config?: Partial<Config>): Promise<Freshness>;
  refresh(session: string, config?: Partial<Config>): Promise<Outcome>;
  context(session: string, request?: Partial<ContextRequest>, config?: Partial<Config>): Promise<ContextWindow>;
  /** Full-text search of every message (of one session with `session`), best first. */
  search(query: string, options?: { session?: string; offset?: number; limit?: number }): Promise<{ hits: SearchHit[]; more: boolean }>;
  /** Index the messages stored before the full-text index existed; the messages indexed. */
  indexPending(onProgress?: (p: { done: number; total: number }) => void): Promise<number>;
  reset(session: string): Promise<void>;
  estimateTokens(text: string): Promise<number>;
  buildPrompt(conversation: Message[], previousSummary?: string): Promise<{ messages: Message[]; chatml: string }>;
  stripTemplateTokens(text: string): Promise<string>;
  /** Create a fresh instance without calling it (for benchmarks). */
  instantiateOnly(): Promise<void>;
}

export function createEngine(options?: EngineOptions): Promise<Engine>;
