//! Maximum-sustainable-rate discovery, after the OpenMessaging Benchmark's: the highest producer
//! rate at which the consumers keep up, found by short probes at fixed target rates.
//!
//! This module is pure: it judges a probe's figures against the criteria and, given every
//! outcome so far, says which rate to probe next or that the search is over. `main.rs` runs the
//! probes (each on fresh topics and a fresh consumer group) and feeds the outcomes back.
//!
//! The search starts from the maximum-rate run. When that run already kept up, the rate it
//! reached is the answer and nothing is probed. Otherwise the first probe is at the rate its
//! consumers reached (at least a tenth of its publish rate, at most nine tenths of it). While
//! every probe passes, the rate rises by `STEP_UP` (never above `CEILING_OVER_MAX_RUN` times the
//! maximum-rate run's publish rate); while every probe fails, it falls to just under what that
//! probe's consumers read (between `STEP_DOWN_FACTOR_MIN` and `STEP_DOWN_FACTOR_MAX` of its target). Once one
//! rate has passed and a higher one failed, it bisects (geometric mean) until the two are within
//! the resolution or the probes run out. The answer is the highest rate that passed.

use serde::Serialize;

/// Rate rise after a passing probe while no higher rate has failed.
pub const STEP_UP: f64 = 1.5;
/// A probe is never above this multiple of the maximum-rate run's publish rate: the producers
/// reached no more than that rate when nothing held them back; the margin covers noise.
pub const CEILING_OVER_MAX_RUN: f64 = 1.1;
/// After a failure with no passing rate yet, the next rate is at most this fraction of the
/// failed target: probes that fail on latency alone (their consumers read everything) would
/// otherwise creep down a little at a time; halving brackets the answer, and bisection comes
/// back up...
pub const STEP_DOWN_FACTOR_MAX: f64 = 0.5;
/// ...and at least this fraction, however little the consumers read.
pub const STEP_DOWN_FACTOR_MIN: f64 = 0.25;
/// After such a failure, the next rate aims this far under what its consumers read.
pub const BELOW_CONSUMED: f64 = 0.9;
/// The first probe is at the maximum-rate run's consume rate, kept within these fractions of its
/// publish rate (its consumers may have read little because the producers starved them).
pub const START_OVER_MAX_RUN_MIN: f64 = 0.1;
pub const START_OVER_MAX_RUN_MAX: f64 = 0.9;
/// A probe must publish at least this fraction of its target: a producer that cannot reach the
/// target is held back by the broker, which is not sustaining that rate.
pub const PUBLISH_OVER_TARGET_MIN: f64 = 0.95;
/// No probe below one message per second.
pub const RATE_MIN: f64 = 1.0;
/// The most probes a search may be given (each is a bounded run of its own).
pub const PROBE_COUNT_LIMIT: u32 = 20;

const _: () = assert!(STEP_DOWN_FACTOR_MIN < STEP_DOWN_FACTOR_MAX);
const _: () = assert!(STEP_DOWN_FACTOR_MAX < 1.0);
const _: () = assert!(START_OVER_MAX_RUN_MIN < START_OVER_MAX_RUN_MAX);
const _: () = assert!(STEP_UP > 1.0);
const _: () = assert!(CEILING_OVER_MAX_RUN >= 1.0);

/// What a probe must show to pass.
#[derive(Clone, Debug, Serialize)]
pub struct Criteria {
    /// End-to-end p99 over the measured window at most this (microseconds).
    pub e2e_p99_us_max: u64,
    /// Consumed messages per second at least this fraction of published ones.
    pub consume_over_publish_min: f64,
    /// Published messages per second at least this fraction of the target.
    pub publish_over_target_min: f64,
}

/// What one probe (or the maximum-rate run) measured over its window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Outcome {
    /// The producers' rate over all producers; for the maximum-rate run, what it published.
    pub target_msg_per_s: f64,
    pub publish_msg_per_s: f64,
    pub publish_mb_per_s: f64,
    /// Over all consumer groups: each group reads everything, so this is divided by their count.
    pub consume_msg_per_s: f64,
    pub consume_mb_per_s: f64,
    pub e2e_p99_us: u64,
    /// The slowest group's backlog at the end of the window, in messages.
    pub backlog_end: u64,
    /// Failed deliveries and consume errors during the probe.
    pub errors: u64,
}

/// An outcome and its verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Probe {
    #[serde(flatten)]
    pub outcome: Outcome,
    pub passed: bool,
    /// Why it failed, one reason per criterion missed; empty when it passed.
    pub failed_because: Vec<String>,
}

impl Criteria {
    pub fn judge(&self, outcome: Outcome) -> Probe {
        let o = &outcome;
        let mut failed_because = Vec::new();
        if o.errors > 0 {
            failed_because.push(format!("{} errors", o.errors));
        }
        if o.publish_msg_per_s < self.publish_over_target_min * o.target_msg_per_s {
            failed_because.push(format!(
                "published {:.3}x the target (under {})",
                o.publish_msg_per_s / o.target_msg_per_s.max(RATE_MIN),
                self.publish_over_target_min
            ));
        }
        if o.consume_msg_per_s < self.consume_over_publish_min * o.publish_msg_per_s {
            failed_because.push(format!(
                "consumed {:.3}x what was published (under {})",
                o.consume_msg_per_s / o.publish_msg_per_s.max(RATE_MIN),
                self.consume_over_publish_min
            ));
        }
        if o.e2e_p99_us > self.e2e_p99_us_max {
            failed_because.push(format!(
                "end-to-end p99 {:.0} ms over {:.0} ms",
                o.e2e_p99_us as f64 / 1e3,
                self.e2e_p99_us_max as f64 / 1e3
            ));
        }
        if o.publish_msg_per_s <= 0.0 {
            failed_because.push("nothing published".into());
        }
        Probe {
            passed: failed_because.is_empty(),
            failed_because,
            outcome,
        }
    }
}

/// The search's bounds.
#[derive(Clone, Debug, Serialize)]
pub struct Search {
    /// Probes after the maximum-rate run, at most.
    pub probe_count_max: u32,
    /// Stop once the lowest failing rate is within this fraction above the highest passing one.
    pub resolution: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Step {
    /// Probe this many messages per second next.
    Probe(f64),
    Done,
}

/// The highest passing target so far (the maximum-rate run included), and the lowest failing
/// probe target above it. A failure below a passing rate (noise on a shared machine) narrows
/// nothing and is ignored; the maximum-rate run's failure is not an upper bound either (its
/// target was unbounded).
fn bounds<'a>(max_run: &'a Probe, probes: &'a [Probe]) -> (Option<&'a Probe>, Option<&'a Probe>) {
    let passed = std::iter::once(max_run)
        .chain(probes)
        .filter(|p| p.passed)
        .max_by(|a, b| {
            a.outcome
                .target_msg_per_s
                .total_cmp(&b.outcome.target_msg_per_s)
        });
    let lo = passed.map_or(0.0, |p| p.outcome.target_msg_per_s);
    let failed = probes
        .iter()
        .filter(|p| !p.passed && p.outcome.target_msg_per_s > lo)
        .min_by(|a, b| {
            a.outcome
                .target_msg_per_s
                .total_cmp(&b.outcome.target_msg_per_s)
        });
    (passed, failed)
}

/// What to do after `probes` (in the order they ran), given the maximum-rate run.
pub fn next_step(max_run: &Probe, probes: &[Probe], search: &Search) -> Step {
    if probes.len() >= search.probe_count_max as usize {
        return Step::Done;
    }
    let ceiling = max_run.outcome.publish_msg_per_s * CEILING_OVER_MAX_RUN;
    let next = match bounds(max_run, probes) {
        (Some(lo), Some(hi)) => {
            let (lo, hi) = (lo.outcome.target_msg_per_s, hi.outcome.target_msg_per_s);
            if hi <= lo * (1.0 + search.resolution) {
                return Step::Done;
            }
            (lo * hi).sqrt()
        }
        (Some(lo), None) => {
            let lo = lo.outcome.target_msg_per_s;
            if lo * (1.0 + search.resolution) >= ceiling {
                return Step::Done;
            }
            (lo * STEP_UP).min(ceiling)
        }
        (None, Some(hi)) => {
            let target = hi.outcome.target_msg_per_s;
            (hi.outcome.consume_msg_per_s * BELOW_CONSUMED)
                .clamp(target * STEP_DOWN_FACTOR_MIN, target * STEP_DOWN_FACTOR_MAX)
        }
        (None, None) => {
            let publish = max_run.outcome.publish_msg_per_s;
            max_run.outcome.consume_msg_per_s.clamp(
                publish * START_OVER_MAX_RUN_MIN,
                publish * START_OVER_MAX_RUN_MAX,
            )
        }
    };
    if next < RATE_MIN {
        return Step::Done;
    }
    Step::Probe(next.round())
}

/// The search's answer: the highest passing rate and the lowest failing one above it.
pub fn conclude<'a>(
    max_run: &'a Probe,
    probes: &'a [Probe],
) -> (Option<&'a Probe>, Option<&'a Probe>) {
    bounds(max_run, probes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRITERIA: Criteria = Criteria {
        e2e_p99_us_max: 1_000_000,
        consume_over_publish_min: 0.97,
        publish_over_target_min: PUBLISH_OVER_TARGET_MIN,
    };
    const SEARCH: Search = Search {
        probe_count_max: 6,
        resolution: 0.1,
    };

    fn outcome(target: f64, publish: f64, consume: f64, p99_ms: u64) -> Outcome {
        Outcome {
            target_msg_per_s: target,
            publish_msg_per_s: publish,
            publish_mb_per_s: publish / 1000.0,
            consume_msg_per_s: consume,
            consume_mb_per_s: consume / 1000.0,
            e2e_p99_us: p99_ms * 1000,
            backlog_end: 0,
            errors: 0,
        }
    }

    /// A broker whose consumers read at most `capacity` msg/s and whose producers reach at most
    /// `publish_max`: what a probe at `target` would see.
    fn simulated(target: f64, capacity: f64, publish_max: f64) -> Probe {
        let publish = target.min(publish_max);
        let consume = publish.min(capacity);
        let p99_ms = if consume < publish { 5_000 } else { 20 };
        CRITERIA.judge(outcome(target, publish, consume, p99_ms))
    }

    fn search(capacity: f64, publish_max: f64) -> (Vec<f64>, Option<f64>) {
        // The maximum-rate run: consumers starved by the producers read a fifth of capacity.
        let consume = if capacity < publish_max {
            capacity / 5.0
        } else {
            publish_max
        };
        let p99_ms = if consume < publish_max { 9_000 } else { 30 };
        let max_run = CRITERIA.judge(outcome(publish_max, publish_max, consume, p99_ms));
        let mut probes = Vec::new();
        while let Step::Probe(rate) = next_step(&max_run, &probes, &SEARCH) {
            assert!(probes.len() < SEARCH.probe_count_max as usize);
            probes.push(simulated(rate, capacity, publish_max));
        }
        let rates = probes.iter().map(|p| p.outcome.target_msg_per_s).collect();
        let best = conclude(&max_run, &probes).0;
        (rates, best.map(|p| p.outcome.target_msg_per_s))
    }

    #[test]
    fn a_probe_passes_only_when_every_criterion_holds() {
        let p = CRITERIA.judge(outcome(100_000.0, 99_000.0, 98_500.0, 40));
        assert!(p.passed, "{:?}", p.failed_because);
        let p = CRITERIA.judge(outcome(100_000.0, 99_000.0, 90_000.0, 40));
        assert!(!p.passed);
        assert_eq!(
            p.failed_because,
            ["consumed 0.909x what was published (under 0.97)"]
        );
        let p = CRITERIA.judge(outcome(100_000.0, 80_000.0, 80_000.0, 1_500));
        assert_eq!(
            p.failed_because,
            [
                "published 0.800x the target (under 0.95)",
                "end-to-end p99 1500 ms over 1000 ms"
            ]
        );
        let mut o = outcome(100_000.0, 100_000.0, 100_000.0, 10);
        o.errors = 3;
        assert_eq!(CRITERIA.judge(o).failed_because, ["3 errors"]);
        let p = CRITERIA.judge(outcome(100.0, 0.0, 0.0, 0));
        assert!(!p.passed, "a probe that published nothing proves nothing");
    }

    #[test]
    fn a_max_rate_run_that_kept_up_is_the_answer_without_probes() {
        let max_run = CRITERIA.judge(outcome(250_000.0, 250_000.0, 249_000.0, 300));
        assert!(max_run.passed);
        assert_eq!(next_step(&max_run, &[], &SEARCH), Step::Done);
        let (best, above) = conclude(&max_run, &[]);
        assert_eq!(best.unwrap().outcome.target_msg_per_s, 250_000.0);
        assert!(above.is_none());
    }

    #[test]
    fn the_first_probe_is_the_max_rate_runs_consume_rate_within_bounds() {
        let run = |consume| CRITERIA.judge(outcome(500_000.0, 500_000.0, consume, 9_000));
        assert_eq!(
            next_step(&run(66_000.0), &[], &SEARCH),
            Step::Probe(66_000.0)
        );
        // Consumers that read almost nothing: start at a tenth of the publish rate.
        assert_eq!(next_step(&run(300.0), &[], &SEARCH), Step::Probe(50_000.0));
        // Consumers that kept pace but with a p99 over the limit: start a little below.
        assert_eq!(
            next_step(&run(500_000.0), &[], &SEARCH),
            Step::Probe(450_000.0)
        );
    }

    #[test]
    fn passing_probes_step_up_to_the_ceiling_then_stop() {
        let max_run = CRITERIA.judge(outcome(100_000.0, 100_000.0, 50_000.0, 5_000));
        let probes = vec![CRITERIA.judge(outcome(50_000.0, 50_000.0, 50_000.0, 10))];
        assert_eq!(next_step(&max_run, &probes, &SEARCH), Step::Probe(75_000.0));
        let mut probes = probes;
        probes.push(CRITERIA.judge(outcome(75_000.0, 75_000.0, 75_000.0, 10)));
        // 1.5 x 75,000 is above the ceiling, 1.1 x the max-rate run's 100,000.
        assert_eq!(
            next_step(&max_run, &probes, &SEARCH),
            Step::Probe(110_000.0)
        );
        probes.push(CRITERIA.judge(outcome(110_000.0, 110_000.0, 110_000.0, 10)));
        assert_eq!(next_step(&max_run, &probes, &SEARCH), Step::Done);
    }

    #[test]
    fn failing_probes_step_down_under_what_was_consumed_within_bounds() {
        let max_run = CRITERIA.judge(outcome(400_000.0, 400_000.0, 40_000.0, 9_000));
        let failed = |target: f64, consume: f64| {
            vec![CRITERIA.judge(outcome(target, target, consume, 3_000))]
        };
        assert_eq!(
            next_step(&max_run, &failed(100_000.0, 40_000.0), &SEARCH),
            Step::Probe(36_000.0)
        );
        // Consumers that nearly kept up (a failure on latency): half the rate.
        assert_eq!(
            next_step(&max_run, &failed(100_000.0, 99_000.0), &SEARCH),
            Step::Probe(50_000.0)
        );
        // Consumers that read almost nothing: at most four times lower.
        assert_eq!(
            next_step(&max_run, &failed(100_000.0, 10.0), &SEARCH),
            Step::Probe(25_000.0)
        );
    }

    #[test]
    fn between_a_pass_and_a_failure_it_bisects_until_the_resolution() {
        let max_run = CRITERIA.judge(outcome(400_000.0, 400_000.0, 40_000.0, 9_000));
        let mut probes = vec![
            CRITERIA.judge(outcome(100_000.0, 100_000.0, 100_000.0, 10)),
            CRITERIA.judge(outcome(150_000.0, 150_000.0, 120_000.0, 4_000)),
        ];
        assert_eq!(
            next_step(&max_run, &probes, &SEARCH),
            Step::Probe(122_474.0)
        );
        probes.push(CRITERIA.judge(outcome(140_000.0, 140_000.0, 140_000.0, 10)));
        // 150,000 is within 10 % of 140,000.
        assert_eq!(next_step(&max_run, &probes, &SEARCH), Step::Done);
        let (best, above) = conclude(&max_run, &probes);
        assert_eq!(best.unwrap().outcome.target_msg_per_s, 140_000.0);
        assert_eq!(above.unwrap().outcome.target_msg_per_s, 150_000.0);
    }

    #[test]
    fn a_failure_below_a_passing_rate_is_noise_and_narrows_nothing() {
        let max_run = CRITERIA.judge(outcome(400_000.0, 400_000.0, 40_000.0, 9_000));
        let probes = vec![
            CRITERIA.judge(outcome(100_000.0, 100_000.0, 100_000.0, 10)),
            CRITERIA.judge(outcome(90_000.0, 90_000.0, 50_000.0, 3_000)),
        ];
        let (best, above) = conclude(&max_run, &probes);
        assert_eq!(best.unwrap().outcome.target_msg_per_s, 100_000.0);
        assert!(above.is_none());
        assert_eq!(
            next_step(&max_run, &probes, &SEARCH),
            Step::Probe(150_000.0)
        );
    }

    #[test]
    fn the_probe_budget_ends_the_search() {
        let max_run = CRITERIA.judge(outcome(400_000.0, 400_000.0, 40_000.0, 9_000));
        let search = Search {
            probe_count_max: 1,
            resolution: 0.1,
        };
        let probes = vec![CRITERIA.judge(outcome(40_000.0, 40_000.0, 40_000.0, 10))];
        assert_eq!(next_step(&max_run, &probes, &search), Step::Done);
        assert_eq!(next_step(&max_run, &[], &search), Step::Probe(40_000.0));
    }

    #[test]
    fn nothing_sustainable_is_an_answer_too() {
        let max_run = CRITERIA.judge(outcome(1_000.0, 1_000.0, 0.0, 0));
        let (rates, best) = search(0.0, 1_000.0);
        assert_eq!(best, None);
        assert!(!rates.is_empty() && rates.len() <= 6, "{rates:?}");
        assert!(conclude(&max_run, &[]).0.is_none());
        // Rates fall by at most 4x per probe, and never below one message per second.
        assert!(rates
            .windows(2)
            .all(|w| w[1] >= w[0] * STEP_DOWN_FACTOR_MIN - 1.0));
        assert!(rates.iter().all(|&r| r >= RATE_MIN));
    }

    #[test]
    fn searches_against_simulated_brokers_land_within_the_resolution() {
        for (capacity, publish_max) in [
            (130_000.0, 500_000.0),
            (60_000.0, 500_000.0),
            (280_000.0, 300_000.0),
            (2_000.0, 480_000.0),
            (1e9, 300_000.0),
        ] {
            let (rates, best) = search(capacity, publish_max);
            let best = best.unwrap_or_else(|| panic!("{capacity}: none found in {rates:?}"));
            let truth = f64::min(capacity, publish_max);
            assert!(
                best <= truth * CEILING_OVER_MAX_RUN,
                "{capacity}: {best} in {rates:?}"
            );
            // Within the resolution, or within what six probes could reach from the start.
            assert!(
                best >= truth / (1.0 + SEARCH.resolution) || rates.len() == 6,
                "{capacity}: {best} from {rates:?}"
            );
            assert!(best >= truth / 2.0, "{capacity}: {best} from {rates:?}");
        }
    }
}
