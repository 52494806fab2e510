//! Model calls: building requests, calibrating token estimates against what the server reports, accepting answers.

#[allow(unused_imports)]
use super::*;

/// Produce summary text for `conversation` (folding into `previous` if given), with the
/// prompt's `extras` (the ledger to keep, the focus). `aim`: what an offline summary's lines
/// are chosen for (a whole conversation's summary, or a stretch of a longer one whose lines a
/// context will pick from).
pub(super) fn generate(
    h: &mut impl Host,
    cfg: &Config,
    conversation: &[Message],
    previous: Option<&str>,
    extras: &prompt::Extras,
    aim: extractive::Aim,
) -> Result<Generated, Error> {
    match cfg.engine {
        Engine::Extractive => {
            let text = extractive::summarize(conversation, previous, cfg.max_output_tokens, aim);
            if text.is_empty() {
                return Err(Error::RejectedOutput(
                    "the episodes contain no text to select from".into(),
                ));
            }
            Ok(Generated {
                text,
                prompt_tokens: 0,
                output_tokens: 0,
                skipped: Vec::new(),
            })
        }
        Engine::Llm => {
            let req = request(cfg, prompt::build_x(conversation, previous, extras));
            let estimated = prompt_estimate(&req);
            let source = source_text(&req);
            let resp = h.generate(req);
            calibrate(h, cfg, estimated, &resp)?;
            accept(h, cfg, resp?, estimated, &source)
        }
    }
}

/// The model's calibration factor (1.0 for the extractive engine).
pub(super) fn calibration_factor(h: &mut impl Host, cfg: &Config) -> Result<f64, Error> {
    if cfg.engine != Engine::Llm {
        return Ok(1.0);
    }
    Ok(policy::factor(h.calibration(&cfg.model)?))
}

/// Our estimate of a request's prompt, counted the way budgets count it.
pub(crate) fn prompt_estimate(req: &Request) -> u32 {
    match &req.prompt {
        Prompt::Chat(ms) => {
            ms.iter()
                .map(|m| estimate_tokens(&m.content) + crate::tokens::MESSAGE_OVERHEAD)
                .sum::<u32>()
                + crate::tokens::MESSAGE_OVERHEAD
        }
        Prompt::Raw(s) => estimate_tokens(s),
    }
}

/// Learn from a model's answer: a reported prompt count calibrates the estimator; a refusal
/// as over-long records that the model counts at least a quarter more than the context.
pub(super) fn calibrate(
    h: &mut impl Host,
    cfg: &Config,
    estimated: u32,
    resp: &Result<Response, Error>,
) -> Result<(), Error> {
    match resp {
        Ok(r) => match r.prompt_tokens {
            // A count at the context's size may be a silent truncation, and so is one far
            // below our estimate (a server that cut the prompt to a smaller window of its
            // own, as Ollama's /v1 does without num_ctx): neither is a measurement.
            Some(p) if p > 0 && p < cfg.context_length && !truncated(estimated, p) => {
                h.record_calibration(&cfg.model, estimated, p)
            }
            Some(p) if p > 0 && truncated(estimated, p) => {
                h.log(
                    Level::Warn,
                    &format!(
                        "the model counted {p} prompt tokens for a prompt estimated at {estimated}: \
                         the server probably truncated it; not used for calibration"
                    ),
                );
                Ok(())
            }
            _ => Ok(()),
        },
        Err(Error::ContextOverflow(_)) => {
            let over = cfg
                .context_length
                .saturating_add(cfg.context_length / 4)
                .max(estimated.saturating_add(estimated / 4));
            h.log(Level::Warn, &format!("the model refused a prompt we estimated at {estimated} tokens as longer than its {}-token context; recalibrating", cfg.context_length));
            h.record_refusal(&cfg.model, estimated, over)
        }
        Err(_) => Ok(()),
    }
}

/// Whether a reported prompt count is too far below our estimate to be the whole prompt. The
/// estimator over-counts BPE tokenizers by a fraction, never by half, on prompts large enough
/// to matter.
pub(crate) fn truncated(estimated: u32, reported: u32) -> bool {
    estimated >= 512 && u64::from(reported) * 2 < u64::from(estimated)
}

/// The model request for a built prompt, in the configured rendering.
pub(crate) fn request(cfg: &Config, built: prompt::Built) -> Request {
    let (prompt, stop) = match cfg.rendering {
        Rendering::Chat => (Prompt::Chat(built.messages), Vec::new()),
        Rendering::Chatml => (
            Prompt::Raw(built.chatml),
            prompt::CHATML_STOP.iter().map(|s| s.to_string()).collect(),
        ),
    };
    Request {
        model: cfg.model.clone(),
        prompt,
        temperature: cfg.temperature,
        max_output_tokens: cfg.max_output_tokens,
        context_length: cfg.context_length,
        stop,
        cache_key: None,
        seed: None,
    }
}

/// What a request gives the model to summarize: its non-system messages (the conversation,
/// the current summary, the ledger), or the whole raw prompt. A quotation in the answer must
/// occur here.
pub(super) fn source_text(req: &Request) -> String {
    match &req.prompt {
        Prompt::Chat(ms) => ms
            .iter()
            .filter(|m| m.role != crate::types::Role::System)
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        Prompt::Raw(s) => s.clone(),
    }
}

/// Clean a model answer and pass it through the quality gate, including the provenance check:
/// a quoted span must occur in `source` (see [`quality::unsupported_quote`]).
pub(super) fn accept(
    h: &mut impl Host,
    cfg: &Config,
    resp: Response,
    estimated: u32,
    source: &str,
) -> Result<Generated, Error> {
    if let Some(p) = resp.prompt_tokens
        && p >= cfg.context_length.saturating_sub(cfg.max_output_tokens)
    {
        h.log(
            Level::Warn,
            &format!(
                "the model counted {p} prompt tokens against a context of {}: the server may have truncated the prompt",
                cfg.context_length
            ),
        );
    }
    let cleaned = strip::strip_template_tokens(&resp.text);
    quality::check(&cleaned, resp.finish, cfg.max_output_tokens, estimated)
        .and_then(|()| match quality::unsupported_quote(&cleaned, &[source]) {
            Some(q) => Err(format!(
                "the summary quotes \"{q}\", which does not occur in the text it summarizes (an invented quotation)"
            )),
            None => Ok(()),
        })
        .map_err(|why| {
            h.log(Level::Warn, &format!("summary rejected: {why}"));
            Error::RejectedOutput(why)
        })?;
    Ok(Generated {
        text: cleaned,
        prompt_tokens: resp.prompt_tokens.unwrap_or(0),
        output_tokens: resp.output_tokens.unwrap_or(0),
        skipped: Vec::new(),
    })
}
