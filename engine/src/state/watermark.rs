//! Watermark rules (Spark's): the watermark is the largest event time a
//! committed batch read, minus the delay; it never goes back; rows at or
//! below the watermark in force when a batch runs are late.

use crate::checkpoint::{Control, StatefulState};
use crate::pipeline::{OutputMode, Pipeline};

/// The watermark a batch runs under: the last commit's (batches commit
/// in order, so it is the batch before this one's), microseconds.
pub(crate) fn in_force(control: &Control) -> Option<i64> {
    control.stateful.as_ref().and_then(|s| s.watermark_us)
}

/// The watermark a stateful query's state is under now: the committed
/// one, advanced to the wall clock minus `wallclock_bound` if set.
pub(crate) fn current(p: &Pipeline, control: &Control, now_ms: i64) -> Option<i64> {
    let w = p.watermark.as_ref()?;
    let committed = in_force(control);
    let clock = w
        .wallclock_bound_us
        .map(|b| now_ms.saturating_mul(1000).saturating_sub(b));
    committed.max(clock).filter(|_| control.stateful.is_some())
}

/// The watermark after a batch whose largest event time read is
/// `max_event_us`: the largest event time less the delay, never below the
/// watermark `before` it.
pub(crate) fn after_batch(
    p: &Pipeline,
    before: &StatefulState,
    max_event_us: Option<i64>,
) -> Option<i64> {
    match (&p.watermark, max_event_us) {
        (Some(w), Some(m)) => Some(
            before
                .watermark_us
                .map_or(m - w.delay_us, |old| old.max(m - w.delay_us)),
        ),
        _ => before.watermark_us,
    }
}

/// Whether a stateful query owes a batch with no input: the watermark
/// (committed, or advanced by the wall clock) has reached the end of a
/// window still in the state (append and update modes only: complete mode
/// keeps every window and writes them all with each batch), or the expiry
/// of a key `[deduplicate]` holds (Spark runs that batch too: a key the
/// next run sees again is forgotten by then).
pub(crate) fn closing_owed(p: &Pipeline, control: &Control, now_ms: i64) -> bool {
    let Some(s) = &control.stateful else {
        return false;
    };
    if let (Some(now), Some(expiry)) = (current(p, control, now_ms), s.next_expiry_us)
        && now >= expiry
    {
        return true;
    }
    if p.output_mode == OutputMode::Complete {
        return false;
    }
    match (current(p, control, now_ms), s.next_close_us) {
        (Some(now), Some(end)) => now >= end,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN_US: i64 = 60_000_000;

    /// A pipeline with `[watermark] delay = "10 minutes"`.
    fn pipeline() -> Pipeline {
        let toml = r#"name = "w"
[source]
uri = "in"
format = "parquet"
table = "t"
[query]
sql = "SELECT count(*) FROM t GROUP BY window(ts, '5 minutes')"
[watermark]
column = "ts"
delay = "10 minutes"
[sink]
uri = "out"
[checkpoint]
uri = "ck"
"#;
        Pipeline::parse(toml, "w.toml", std::path::Path::new("/tmp")).unwrap()
    }

    fn control(watermark_us: Option<i64>, next_close_us: Option<i64>) -> Control {
        Control {
            stateful: Some(StatefulState {
                watermark_us,
                next_close_us,
                ..StatefulState::default()
            }),
            ..Control::new(String::new())
        }
    }

    #[test]
    fn a_batch_moves_the_watermark_to_its_latest_event_less_the_delay_and_never_back() {
        let p = pipeline();
        let none = StatefulState::default();
        assert_eq!(after_batch(&p, &none, None), None);
        assert_eq!(after_batch(&p, &none, Some(60 * MIN_US)), Some(50 * MIN_US));
        let at_50 = StatefulState {
            watermark_us: Some(50 * MIN_US),
            ..StatefulState::default()
        };
        // Older events than the last batch's do not move it back.
        assert_eq!(
            after_batch(&p, &at_50, Some(30 * MIN_US)),
            Some(50 * MIN_US)
        );
        assert_eq!(after_batch(&p, &at_50, None), Some(50 * MIN_US));
        assert_eq!(
            after_batch(&p, &at_50, Some(70 * MIN_US)),
            Some(60 * MIN_US)
        );
        // Without [watermark] there is none to move.
        let mut plain = p.clone();
        plain.watermark = None;
        assert_eq!(
            after_batch(&plain, &at_50, Some(70 * MIN_US)),
            Some(50 * MIN_US)
        );
    }

    #[test]
    fn the_wall_clock_bound_advances_the_watermark_in_force_only_forward() {
        let mut p = pipeline();
        let c = control(Some(50 * MIN_US), Some(55 * MIN_US));
        let now_ms = 100 * MIN_US / 1000;
        assert_eq!(current(&p, &c, now_ms), Some(50 * MIN_US));
        assert!(!closing_owed(&p, &c, now_ms), "50 min has not reached 55");
        p.watermark.as_mut().unwrap().wallclock_bound_us = Some(30 * MIN_US);
        assert_eq!(current(&p, &c, now_ms), Some(70 * MIN_US));
        assert!(
            closing_owed(&p, &c, now_ms),
            "70 min passed the window ending at 55"
        );
        // A bound far behind the committed watermark leaves it.
        p.watermark.as_mut().unwrap().wallclock_bound_us = Some(90 * MIN_US);
        assert_eq!(current(&p, &c, now_ms), Some(50 * MIN_US));
        // No state yet: no watermark, nothing owed.
        let fresh = Control::new(String::new());
        assert_eq!(current(&p, &fresh, now_ms), None);
        assert!(!closing_owed(&p, &fresh, now_ms));
    }

    #[test]
    fn complete_mode_and_a_state_without_windows_owe_no_closing_batch() {
        let mut p = pipeline();
        let c = control(Some(60 * MIN_US), Some(55 * MIN_US));
        assert!(closing_owed(&p, &c, 0));
        p.output_mode = OutputMode::Complete;
        assert!(!closing_owed(&p, &c, 0));
        p.output_mode = OutputMode::Append;
        assert!(!closing_owed(&p, &control(Some(60 * MIN_US), None), 0));
        assert!(!closing_owed(&p, &control(None, Some(55 * MIN_US)), 0));
    }
}
