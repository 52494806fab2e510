//! When to summarize, how, and with how much input.

use crate::types::{Stats, SummaryRow};

/// Where summary text comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// A model through the `llm` import.
    Llm,
    /// Sentence selection in the guest.
    Extractive,
}

/// How prompts are sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    /// Chat messages.
    Chat,
    /// Raw ChatML.
    Chatml,
}

/// Settings for one call (mirrors the WIT `config` record).
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Summary source.
    pub engine: Engine,
    /// Prompt transport.
    pub rendering: Rendering,
    /// Model name.
    pub model: String,
    /// Context window, tokens.
    pub context_length: u32,
    /// Output limit per call, tokens.
    pub max_output_tokens: u32,
    /// Temperature.
    pub temperature: f32,
    /// Trigger: total tokens must exceed this.
    pub threshold_tokens: u32,
    /// Trigger: at least this many new episodes.
    pub min_episodes_since: u32,
    /// Strategy: update the latest row while it is under this many tokens.
    pub max_summary_tokens: u32,
    /// Map-reduce: most chunks (percent) that may be skipped before the call fails.
    pub max_skipped_percent: u32,
    /// Map-reduce: cap on a chunk's estimated tokens (0: derived).
    pub chunk_tokens: u32,
    /// When automatic refreshes summarize.
    pub mode: Mode,
    /// Idle mode: quiet seconds after the last episode before summarizing.
    pub quiescence_secs: u32,
    /// Idle mode: backlog tokens that earn an active conversation a provisional summary
    /// (0: never).
    pub provisional_tokens: u32,
    /// Consecutive failed refreshes before automatic refreshes stop.
    pub max_attempts: u32,
    /// First backoff after a failed refresh, seconds (doubled per further failure).
    pub retry_base_secs: u32,
    /// Eager trigger: unsummarized tokens that are due whatever the episode count.
    pub max_backlog_tokens: u32,
    /// Second level: most tokens of the active chain before the oldest rows are compacted.
    pub summary_budget_tokens: u32,
    /// The facts ledger's budget (per row and in a context); 0: no ledger.
    pub ledger_tokens: u32,
    /// Window mode: messages the context keeps verbatim (only older ones are folded).
    pub window_messages: u32,
    /// Focus instructions added to every fold prompt.
    pub focus: String,
}

/// When automatic refreshes summarize (mirrors the WIT `mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// After each episode write, under the trigger thresholds.
    Eager,
    /// Once the conversation has been quiet for the quiescence window.
    Idle,
    /// Fold only what has left the context's recent window, in bounded-overhead batches.
    Window,
}

impl Default for Config {
    /// The documented defaults, and their one source: the component exports them
    /// (`summarizer.default-config`), and every host reads them from there.
    fn default() -> Self {
        Config {
            engine: Engine::Llm,
            rendering: Rendering::Chat,
            model: "qwen2.5:3b".into(),
            context_length: 4096,
            max_output_tokens: 500,
            temperature: 0.2,
            threshold_tokens: 200,
            min_episodes_since: 5,
            max_summary_tokens: 800,
            max_skipped_percent: 50,
            chunk_tokens: 0,
            mode: Mode::Window,
            quiescence_secs: 3600,
            provisional_tokens: 0,
            max_attempts: 5,
            retry_base_secs: 60,
            max_backlog_tokens: 1000,
            summary_budget_tokens: 1200,
            ledger_tokens: 300,
            window_messages: 8,
            focus: String::new(),
        }
    }
}

/// What a summary pass does.
#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    /// No summary yet: summarize the unsummarized episodes from scratch.
    Fresh,
    /// Fold new episodes into the latest row (which is under `max_summary_tokens`).
    Update(SummaryRow),
    /// The latest row is full: start a new row for the new episodes.
    NewRow,
}

/// Episodes after the newest summary.
pub fn unsummarized(stats: &Stats, latest: Option<&SummaryRow>) -> u64 {
    stats
        .last_episode
        .saturating_sub(latest.map_or(0, |r| r.last_episode))
}

/// The trigger: total tokens over the threshold and enough episodes since the last summary.
/// `backlog_tokens` are the estimated tokens of the unsummarized episodes: at
/// `max_backlog_tokens` or more they are due whatever their count.
pub fn should_trigger(
    stats: &Stats,
    latest: Option<&SummaryRow>,
    backlog_tokens: u64,
    cfg: &Config,
) -> bool {
    let since = unsummarized(stats, latest);
    since > 0
        && stats.total_tokens > u64::from(cfg.threshold_tokens)
        && (since >= u64::from(cfg.min_episodes_since) || backlog_over(backlog_tokens, cfg))
}

/// Whether unsummarized tokens reach the eager trigger's token limit.
pub fn backlog_over(backlog_tokens: u64, cfg: &Config) -> bool {
    cfg.max_backlog_tokens > 0 && backlog_tokens >= u64::from(cfg.max_backlog_tokens)
}

/// How many times the fold's fixed part a window-mode fold must carry: its overhead is then
/// at most a twentieth of what it folds.
pub const WINDOW_BATCH_FACTOR: u32 = 20;

/// The most tokens a window-mode fold waits for beyond the recent window. What waits is shown
/// verbatim in every context beside the summary, so a batch that grew with a long ledger or a
/// large model context would crowd the summary out of an ordinary one (with the recent window,
/// 4,000 tokens leave a 6,000-token context room for the summary and its ledger).
pub const WINDOW_BATCH_MAX: u32 = 4_000;

/// Window mode's fold size: tokens that must have left the recent window before a fold,
/// [`WINDOW_BATCH_FACTOR`] times the fold's fixed part (instructions, summary, the ledger
/// entries the summary mentions) so its overhead is at most a twentieth of what it folds,
/// within the conversation budget of one prompt `budget` and [`WINDOW_BATCH_MAX`].
pub fn window_batch(fixed: u32, budget: u32) -> u32 {
    fixed
        .saturating_mul(WINDOW_BATCH_FACTOR)
        .min(budget)
        .clamp(1, WINDOW_BATCH_MAX)
}

/// Pick the strategy for the next pass. Only an episode summary (level 0) is updated in place.
pub fn strategy(latest: Option<&SummaryRow>, cfg: &Config) -> Strategy {
    match latest {
        None => Strategy::Fresh,
        Some(row) if row.tokens < cfg.max_summary_tokens && row.level == 0 => {
            Strategy::Update(row.clone())
        }
        Some(_) => Strategy::NewRow,
    }
}

/// Tokens kept free of any prompt: a tenth of the context, at least 32, for estimator error.
pub fn safety_margin(context_length: u32) -> u32 {
    (context_length / 10).max(32)
}

/// Smallest conversation budget worth a call.
pub const MIN_INPUT_BUDGET: u32 = 64;

/// Estimated tokens needed before a model's calibration is trusted.
pub const MIN_CALIBRATION_TOKENS: u64 = 500;

/// The calibration factor: the model's counts over our estimates, from running totals
/// `(estimated, reported)`, once at least [`MIN_CALIBRATION_TOKENS`] were measured; clamped to
/// 0.5–4. 1.0 without enough data.
pub fn factor(totals: Option<(u64, u64)>) -> f64 {
    match totals {
        Some((est, rep)) if est >= MIN_CALIBRATION_TOKENS => {
            (rep as f64 / est as f64).clamp(0.5, 4.0)
        }
        _ => 1.0,
    }
}

/// [`input_budget`] with the factor first (reads better at call sites).
pub fn input_budget_f(cfg: &Config, factor: f64, fixed: u32) -> Result<u32, String> {
    input_budget(cfg, fixed, factor)
}

/// Tokens (in the estimator's units) available for conversation text in one prompt whose
/// fixed part costs `fixed`, for a model that counts `factor` times our estimates.
pub fn input_budget(cfg: &Config, fixed: u32, factor: f64) -> Result<u32, String> {
    let available = u64::from(cfg.context_length).saturating_sub(
        u64::from(cfg.max_output_tokens) + u64::from(safety_margin(cfg.context_length)),
    );
    let budget = ((available as f64 / factor.max(0.01)) as u64).saturating_sub(u64::from(fixed));
    if budget < u64::from(MIN_INPUT_BUDGET) {
        return Err(format!(
            "context length {} leaves {budget} tokens for the conversation after the prompt \
             ({fixed}), the output reserve ({}) and the safety margin ({}), with the model \
             counting {factor:.2}x our estimates; raise the context length or lower \
             max-output-tokens",
            cfg.context_length,
            cfg.max_output_tokens,
            safety_margin(cfg.context_length)
        ));
    }
    Ok(budget as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(last: u64, tokens: u32) -> SummaryRow {
        SummaryRow::plain(1, 1, last, "s", tokens)
    }

    fn stats(last: u64, total: u64) -> Stats {
        Stats {
            episodes: last,
            total_tokens: total,
            last_episode: last,
        }
    }

    #[test]
    fn trigger_table() {
        let cfg = Config::default(); // threshold 200 tokens, 5 episodes
        let r = row(10, 100);
        let cases: &[(Stats, Option<&SummaryRow>, bool)] = &[
            (stats(0, 0), None, false),
            (stats(4, 1000), None, false), // too few episodes
            (stats(5, 200), None, false),  // tokens must exceed the threshold
            (stats(5, 201), None, true),
            (stats(14, 5000), Some(&r), false), // 4 since the summary
            (stats(15, 5000), Some(&r), true),
            (stats(10, 5000), Some(&r), false), // caught up
        ];
        for (s, latest, want) in cases {
            assert_eq!(
                should_trigger(s, *latest, 0, &cfg),
                *want,
                "{s:?} latest={latest:?}"
            );
        }
        // Two huge messages are due whatever their count: the backlog reaches the limit.
        assert!(!should_trigger(&stats(2, 7000), None, 999, &cfg));
        assert!(should_trigger(&stats(2, 7000), None, 7000, &cfg));
        assert!(backlog_over(1000, &cfg) && !backlog_over(999, &cfg));
        assert_eq!(window_batch(60, 2000), 1200);
        assert_eq!(window_batch(150, 2000), 2000, "capped by one prompt");
        assert_eq!(
            window_batch(400, 7000),
            WINDOW_BATCH_MAX,
            "capped for the context"
        );
    }

    #[test]
    fn strategy_table() {
        let cfg = Config::default(); // max summary 800
        assert_eq!(strategy(None, &cfg), Strategy::Fresh);
        assert_eq!(
            strategy(Some(&row(3, 799)), &cfg),
            Strategy::Update(row(3, 799))
        );
        assert_eq!(strategy(Some(&row(3, 800)), &cfg), Strategy::NewRow);
    }

    #[test]
    fn budget() {
        let cfg = Config::default(); // 4096 ctx, 500 out, margin 409
        assert_eq!(input_budget(&cfg, 100, 1.0), Ok(4096 - 500 - 100 - 409));
        assert_eq!(
            input_budget(&cfg, 100, 2.0),
            Ok((4096 - 500 - 409) / 2 - 100)
        );
        assert_eq!(factor(None), 1.0);
        assert_eq!(factor(Some((100, 300))), 1.0, "too little data");
        assert_eq!(factor(Some((1000, 1500))), 1.5);
        assert_eq!(factor(Some((1000, 9000))), 4.0, "clamped");
        let tiny = Config {
            context_length: 600,
            ..Config::default()
        };
        assert!(
            input_budget(&tiny, 100, 1.0)
                .unwrap_err()
                .contains("raise the context length")
        );
    }
}
