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
                "[{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} {unit} {{per_sec}} ETA {{eta}}"
            ))
            .expect("a valid template"),
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

    /// Done: leave the bar's last state on the terminal.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
