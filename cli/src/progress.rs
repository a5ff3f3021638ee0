//! Progress of long local commands (`sluice run`, `sluice gen`): a bar
//! with rate and ETA on stderr when stderr is a terminal; otherwise
//! nothing but the plain lines the command prints anyway, so logs and CI
//! output stay clean.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` units, or plain lines.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Whether a bar would be drawn: stderr is a terminal (and not a dumb
    /// one).
    pub fn wanted() -> bool {
        std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb")
    }

    /// Plain lines only.
    pub fn none() -> Progress {
        Progress { bar: None }
    }

    /// A bar over `total` `unit`s if [`Self::wanted`], else plain lines.
    pub fn new(total: u64, unit: &str) -> Progress {
        if !Self::wanted() {
            return Progress { bar: None };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(&format!(
                "[{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} {{rate}} ETA {{eta}}"
            ))
            .expect("a valid template")
            // One decimal (indicatif's own prints 15.0501/s).
            .with_key(
                "rate",
                |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = write!(w, "{:.1}/s", s.per_sec());
                },
            ),
        );
        Progress { bar: Some(bar) }
    }

    /// Print `text` as a line (above the bar, if there is one).
    pub fn line(&self, text: &str) {
        match &self.bar {
            Some(b) => b.println(text),
            None => println!("{text}"),
        }
    }

    /// `n` more units done.
    pub fn inc(&self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Done: the bar is cleared, so what the command prints next starts
    /// its own line (the lines printed above the bar stay).
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}
