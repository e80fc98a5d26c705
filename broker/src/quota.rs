//! Client quotas, enforced as Kafka enforces them: `producer_byte_rate` on produce request
//! bytes, `consumer_byte_rate` on fetched record bytes, `request_percentage` on the time the
//! shard spends on the client's requests (a second of work is 100: [`Worked`]), each measured
//! per broker (over every shard) for the entity the quota was set on, and a client over its
//! quota gets `throttle_time_ms` in its response while the broker stops reading from its
//! connection for that long (KIP-219's muting). `controller_mutation_rate` (KIP-599) is a token
//! bucket instead ([`Bucket`]): topics created, deleted or given partitions take one token per
//! partition, and once it is empty, recent request versions get THROTTLING_QUOTA_EXCEEDED for
//! the topics that would take more.
//!
//! Which quota applies is Kafka's order of precedence, most specific first (`resolve`): user and
//! client id, user and default client id, user, default user and client id, default user and
//! default client id, default user, client id, default client id. Clients that match the same
//! entity share one measurement: a quota on user `alice` bounds all her clients together, a
//! default quota bounds each user (or client id) on its own.
//!
//! The rate is Kafka's sampled rate: `quota.window.num` samples of `quota.window.size.seconds`
//! each, the bytes they hold over the time they span, at least all but one full sample (so a
//! client's first second is not judged alone). Over the bound, the throttle time is how long the
//! client must send nothing for the rate to come back to it (unbounded for byte rates, as in
//! Kafka: a client that took ten windows' worth at once waits about that long).
//!
//! The measurements are the one place where shards share state on the data path: a client's
//! connections may sit on any shard, and the quota is the broker's. They are behind one lock,
//! taken only for requests of clients that have a quota; clients without one never reach it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sluice_replication::records::{QuotaEntity, QuotaValue};

pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONTROLLER_MUTATION_RATE: &str = "controller_mutation_rate";
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// Every client quota of the cluster, by entity then key (the metadata image's).
pub type Quotas = BTreeMap<QuotaEntity, BTreeMap<String, QuotaValue>>;

/// One measurement: a quota key and the entity the quota matched, with the client's names
/// where the entity has a default (Kafka's metric tags).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SensorKey {
    pub key: &'static str,
    pub user: Option<String>,
    pub client_id: Option<String>,
    /// For `connection_creation_rate`: the client's address.
    pub ip: Option<String>,
}

/// The quota a client is held to for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    pub sensor: SensorKey,
    /// Bytes per second.
    pub bound: f64,
}

/// The user a principal is for quotas: its name after the type (`User:alice` is `alice`).
pub fn user_of(principal: &str) -> &str {
    principal
        .split_once(':')
        .map_or(principal, |(_, name)| name)
}

/// The quota on `key` that applies to `user` with `client_id`, in Kafka's order of precedence.
pub fn resolve(quotas: &Quotas, key: &'static str, user: &str, client_id: &str) -> Option<Applied> {
    if quotas.is_empty() {
        return None;
    }
    let named = |s: &str| Some(s.to_string());
    // A part of an entity: `Some(None)` is the type's default, `None` leaves the type out.
    type Part = Option<Option<String>>;
    // (user part, client-id part), most specific first.
    let order: [(Part, Part); 8] = [
        (Some(named(user)), Some(named(client_id))),
        (Some(named(user)), Some(None)),
        (Some(named(user)), None),
        (Some(None), Some(named(client_id))),
        (Some(None), Some(None)),
        (Some(None), None),
        (None, Some(named(client_id))),
        (None, Some(None)),
    ];
    for (u, c) in order {
        // Entities are sorted by type: "client-id" before "user".
        let mut entity: QuotaEntity = Vec::with_capacity(2);
        if let Some(c) = &c {
            entity.push(("client-id".to_string(), c.clone()));
        }
        if let Some(u) = &u {
            entity.push(("user".to_string(), u.clone()));
        }
        if let Some(value) = quotas.get(&entity).and_then(|keys| keys.get(key)) {
            return Some(Applied {
                sensor: SensorKey {
                    key,
                    user: u.map(|_| user.to_string()),
                    client_id: c.map(|_| client_id.to_string()),
                    ip: None,
                },
                bound: value.0,
            });
        }
    }
    None
}

/// The `connection_creation_rate` quota (KIP-612) on connections from `ip`: the IP's own, or
/// the default IP quota, which bounds each address on its own.
pub fn resolve_ip(quotas: &Quotas, ip: &str) -> Option<Applied> {
    if quotas.is_empty() {
        return None;
    }
    for name in [Some(ip.to_string()), None] {
        let entity: QuotaEntity = vec![("ip".to_string(), name)];
        if let Some(value) = quotas
            .get(&entity)
            .and_then(|keys| keys.get(CONNECTION_CREATION_RATE))
        {
            return Some(Applied {
                sensor: SensorKey {
                    key: CONNECTION_CREATION_RATE,
                    user: None,
                    client_id: None,
                    ip: Some(ip.to_string()),
                },
                bound: value.0,
            });
        }
    }
    None
}

/// The time a request has run on its shard so far: the sum of the polls of its task, for
/// `request_percentage` (Kafka counts the time of its request handler and network threads; a
/// shard's is the time it spends polling the request).
#[derive(Debug, Default)]
pub struct Worked {
    total: std::cell::Cell<Duration>,
    /// When the poll under way began.
    since: std::cell::Cell<Option<Instant>>,
}

impl Worked {
    pub fn so_far(&self) -> Duration {
        self.total.get() + self.since.get().map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// `fut`, its polls added up in `worked` when there is one (a client with a
/// `request_percentage` quota); polled as it is otherwise.
pub struct Timed<F> {
    pub fut: F,
    pub worked: Option<std::rc::Rc<Worked>>,
}

impl<F: std::future::Future + Unpin> std::future::Future for Timed<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let Some(worked) = self.worked.clone() else {
            return std::pin::Pin::new(&mut self.fut).poll(cx);
        };
        let start = Instant::now();
        worked.since.set(Some(start));
        let polled = std::pin::Pin::new(&mut self.fut).poll(cx);
        worked.since.set(None);
        worked.total.set(worked.total.get() + start.elapsed());
        polled
    }
}

/// Kafka's measure of `request_percentage`: a second of work is 100.
pub fn percentage(worked: Duration) -> f64 {
    worked.as_secs_f64() * 100.0
}

/// `quota.window.num` and `quota.window.size.seconds`.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub samples: u32,
    pub sample_ms: u64,
}

impl Window {
    /// The most a client may take in one response and still be within its quota over the
    /// window (Kafka bounds a fetch by it, so that a quota smaller than a fetch still gets
    /// records through).
    pub fn bytes_within(&self, bound: f64) -> f64 {
        bound * (self.samples.saturating_sub(1)) as f64 * self.sample_ms as f64 / 1000.0
    }
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    start_ms: u64,
    value: f64,
}

/// Kafka's sampled rate: a ring of samples, each as long as `Window::sample_ms`.
#[derive(Debug, Default)]
struct Rate {
    samples: Vec<Sample>,
    current: usize,
    last_ms: u64,
}

impl Rate {
    fn record(&mut self, value: f64, now_ms: u64, w: Window) {
        self.last_ms = now_ms;
        if self.samples.is_empty() {
            self.samples.push(Sample {
                start_ms: now_ms,
                value: 0.0,
            });
            self.current = 0;
        }
        if now_ms.saturating_sub(self.samples[self.current].start_ms) >= w.sample_ms {
            self.current = (self.current + 1) % w.samples as usize;
            let fresh = Sample {
                start_ms: now_ms,
                value: 0.0,
            };
            if self.current == self.samples.len() {
                self.samples.push(fresh);
            } else {
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].value += value;
    }

    /// Forgets samples older than the whole window.
    fn purge(&mut self, now_ms: u64, w: Window) {
        let expire = w.sample_ms * u64::from(w.samples);
        for s in &mut self.samples {
            if now_ms.saturating_sub(s.start_ms) >= expire {
                *s = Sample {
                    start_ms: now_ms,
                    value: 0.0,
                };
            }
        }
    }

    /// The time the samples span, at least all but one full sample (ms).
    fn span_ms(&self, now_ms: u64, w: Window) -> u64 {
        let oldest = self
            .samples
            .iter()
            .map(|s| s.start_ms)
            .min()
            .unwrap_or(now_ms);
        let mut span = now_ms.saturating_sub(oldest);
        let full = span / w.sample_ms;
        let min_full = u64::from(w.samples - 1);
        if full < min_full {
            span += (min_full - full) * w.sample_ms;
        }
        span
    }

    /// Per second.
    fn measure(&mut self, now_ms: u64, w: Window) -> f64 {
        self.purge(now_ms, w);
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        total * 1000.0 / self.span_ms(now_ms, w).max(1) as f64
    }
}

/// The broker's quota measurements, shared by its shards.
pub struct Sensors {
    window: Window,
    start: Instant,
    rates: Mutex<Rates>,
}

#[derive(Default)]
struct Rates {
    by_key: HashMap<SensorKey, Rate>,
    /// `controller_mutation_rate`'s token buckets.
    buckets: HashMap<SensorKey, Bucket>,
    swept_ms: u64,
}

/// KIP-599's token bucket for `controller_mutation_rate`: it holds up to a window's worth of
/// mutations (the quota times `quota.window.num` times `quota.window.size.seconds`), fills at
/// the quota per second, and each partition created or deleted takes one; below zero, the quota
/// is exceeded until it fills back.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last_ms: u64,
}

impl Bucket {
    fn refill(&mut self, now_ms: u64, rate: f64, burst: f64) {
        let elapsed = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last_ms = now_ms;
    }
}

/// How often measurements no one recorded into for a whole window are dropped.
const SWEEP_MS: u64 = 60_000;

impl Sensors {
    pub fn new(window: Window) -> Sensors {
        Sensors {
            window,
            start: Instant::now(),
            rates: Mutex::new(Rates::default()),
        }
    }

    pub fn window(&self) -> Window {
        self.window
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Records `bytes` against the quota and returns how long the client is throttled for
    /// (zero within its quota).
    pub fn record(&self, applied: &Applied, bytes: f64) -> Duration {
        self.record_at(applied, bytes, self.now_ms())
    }

    /// [`Sensors::record`] for `request_percentage`, whose throttle Kafka bounds by one
    /// sample's length (`quota.window.size.seconds`).
    pub fn record_request_time(&self, applied: &Applied, percentage: f64) -> Duration {
        self.record(applied, percentage)
            .min(Duration::from_millis(self.window.sample_ms))
    }

    /// Takes back what `record` counted, for a response that was not sent after all.
    pub fn unrecord(&self, applied: &Applied, bytes: f64) {
        let now_ms = self.now_ms();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rate) = rates.by_key.get_mut(&applied.sensor) {
            rate.record(-bytes, now_ms, self.window);
        }
    }

    /// Whether the mutation quota `applied` is exceeded now (its bucket below zero).
    pub fn mutations_exceeded(&self, applied: &Applied) -> bool {
        !self.mutation_throttle(applied).is_zero()
    }

    /// Takes `partitions` mutations from the bucket of `applied` (it may go below zero once).
    pub fn record_mutations(&self, applied: &Applied, partitions: f64) {
        self.record_mutations_at(applied, partitions, self.now_ms());
    }

    /// How long until the bucket of `applied` is back to zero: the throttle time.
    pub fn mutation_throttle(&self, applied: &Applied) -> Duration {
        self.mutation_throttle_at(applied, self.now_ms())
    }

    fn burst(&self, applied: &Applied) -> f64 {
        applied.bound * f64::from(self.window.samples) * self.window.sample_ms as f64 / 1000.0
    }

    fn record_mutations_at(&self, applied: &Applied, partitions: f64, now_ms: u64) {
        let burst = self.burst(applied);
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = rates
            .buckets
            .entry(applied.sensor.clone())
            .or_insert(Bucket {
                tokens: burst,
                last_ms: now_ms,
            });
        bucket.refill(now_ms, applied.bound, burst);
        bucket.tokens -= partitions;
    }

    fn mutation_throttle_at(&self, applied: &Applied, now_ms: u64) -> Duration {
        if applied.bound <= 0.0 {
            return Duration::ZERO;
        }
        let burst = self.burst(applied);
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bucket) = rates.buckets.get_mut(&applied.sensor) else {
            return Duration::ZERO;
        };
        bucket.refill(now_ms, applied.bound, burst);
        if bucket.tokens >= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_millis((-bucket.tokens / applied.bound * 1000.0).ceil() as u64)
    }

    fn record_at(&self, applied: &Applied, bytes: f64, now_ms: u64) -> Duration {
        let w = self.window;
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        if now_ms.saturating_sub(rates.swept_ms) >= SWEEP_MS {
            let expire = w.sample_ms * u64::from(w.samples);
            rates
                .by_key
                .retain(|_, r| now_ms.saturating_sub(r.last_ms) < expire);
            // A bucket left alone a whole window is full again: the same as none.
            rates
                .buckets
                .retain(|_, b| now_ms.saturating_sub(b.last_ms) < expire);
            rates.swept_ms = now_ms;
        }
        let rate = rates.by_key.entry(applied.sensor.clone()).or_default();
        rate.record(bytes, now_ms, w);
        let measured = rate.measure(now_ms, w);
        if measured <= applied.bound || applied.bound <= 0.0 {
            return Duration::ZERO;
        }
        let span = rate.span_ms(now_ms, w) as f64;
        let throttle_ms = ((measured - applied.bound) / applied.bound * span).round() as u64;
        Duration::from_millis(throttle_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entity's parts, a quota key and its value.
    type Entry<'a> = (&'a [(&'a str, Option<&'a str>)], &'a str, f64);

    fn quotas(entries: &[Entry]) -> Quotas {
        let mut q = Quotas::new();
        for (entity, key, value) in entries {
            let mut entity: QuotaEntity = entity
                .iter()
                .map(|(t, n)| (t.to_string(), n.map(str::to_string)))
                .collect();
            entity.sort();
            q.entry(entity)
                .or_default()
                .insert(key.to_string(), QuotaValue(*value));
        }
        q
    }

    #[test]
    fn the_most_specific_quota_applies_in_kafkas_order() {
        let all: Vec<Entry> = vec![
            (
                &[("user", Some("alice")), ("client-id", Some("c1"))],
                PRODUCER_BYTE_RATE,
                1.0,
            ),
            (
                &[("user", Some("alice")), ("client-id", None)],
                PRODUCER_BYTE_RATE,
                2.0,
            ),
            (&[("user", Some("alice"))], PRODUCER_BYTE_RATE, 3.0),
            (
                &[("user", None), ("client-id", Some("c1"))],
                PRODUCER_BYTE_RATE,
                4.0,
            ),
            (
                &[("user", None), ("client-id", None)],
                PRODUCER_BYTE_RATE,
                5.0,
            ),
            (&[("user", None)], PRODUCER_BYTE_RATE, 6.0),
            (&[("client-id", Some("c1"))], PRODUCER_BYTE_RATE, 7.0),
            (&[("client-id", None)], PRODUCER_BYTE_RATE, 8.0),
        ];
        // Remove the most specific one at a time: the next one applies.
        for i in 0..all.len() {
            let q = quotas(&all[i..]);
            let applied = resolve(&q, PRODUCER_BYTE_RATE, "alice", "c1").unwrap();
            assert_eq!(applied.bound, (i + 1) as f64, "with levels {}.. set", i + 1);
        }
        assert_eq!(
            resolve(&quotas(&[]), PRODUCER_BYTE_RATE, "alice", "c1"),
            None
        );
        // Another key is not this one's quota.
        assert_eq!(
            resolve(&quotas(&all), CONSUMER_BYTE_RATE, "alice", "c1"),
            None
        );
        // The measurement is the matched entity's, with the client's names for defaults.
        let q = quotas(&[(&[("user", None)], PRODUCER_BYTE_RATE, 6.0)]);
        let bob = resolve(&q, PRODUCER_BYTE_RATE, "bob", "x").unwrap().sensor;
        assert_eq!(
            bob,
            SensorKey {
                key: PRODUCER_BYTE_RATE,
                user: Some("bob".into()),
                client_id: None,
                ip: None,
            }
        );
        assert_ne!(
            resolve(&q, PRODUCER_BYTE_RATE, "carol", "x")
                .unwrap()
                .sensor,
            bob
        );
        assert_eq!(
            resolve(&q, PRODUCER_BYTE_RATE, "bob", "y").unwrap().sensor,
            bob
        );
        assert_eq!(user_of("User:alice"), "alice");
        assert_eq!(user_of("User:ANONYMOUS"), "ANONYMOUS");
    }

    #[test]
    fn a_client_within_its_quota_is_not_throttled_and_one_over_it_is_held_to_it() {
        let w = Window {
            samples: 11,
            sample_ms: 1000,
        };
        let sensors = Sensors::new(w);
        // A producer quota of 1,000 bytes a second on a user.
        let on_user = |user: &str| Applied {
            sensor: SensorKey {
                key: PRODUCER_BYTE_RATE,
                user: Some(user.into()),
                client_id: None,
                ip: None,
            },
            bound: 1000.0,
        };
        let applied = on_user("u");
        // 900 bytes a second for 30 s: never throttled.
        for t in 0..30 {
            assert_eq!(
                sensors.record_at(&applied, 900.0, t * 1000),
                Duration::ZERO,
                "{t}"
            );
        }
        // A client that sends whenever it is not throttled, 500 bytes at a time, for 60 s:
        // what it gets through is its quota, give or take the first window.
        let other = on_user("v");
        let (mut now, mut sent, mut throttled) = (0u64, 0.0, 0);
        while now < 60_000 {
            sent += 500.0;
            let t = sensors.record_at(&other, 500.0, now);
            if !t.is_zero() {
                throttled += 1;
            }
            now += (t.as_millis() as u64).max(1);
        }
        assert!(throttled > 0);
        let rate = sent / 60.0;
        assert!(
            (950.0..=1_200.0).contains(&rate),
            "{rate} bytes/s against 1000"
        );
        // The throttle is how long it takes the rate back to the bound.
        let hog = on_user("w");
        // 20,000 bytes over the 10 s the rate is measured over at least: 2,000 a second,
        // twice the bound, so 10 s more without any.
        assert_eq!(
            sensors.record_at(&hog, 20_000.0, 100_000),
            Duration::from_millis(10_000)
        );
    }

    #[test]
    fn mutations_take_from_a_bucket_of_a_windows_worth_that_fills_at_the_quota() {
        // 2 mutations a second, 11 samples of 1 s: a bucket of 22.
        let sensors = Sensors::new(Window {
            samples: 11,
            sample_ms: 1000,
        });
        let applied = Applied {
            sensor: SensorKey {
                key: CONTROLLER_MUTATION_RATE,
                user: Some("alice".into()),
                client_id: None,
                ip: None,
            },
            bound: 2.0,
        };
        assert!(sensors.mutation_throttle_at(&applied, 0).is_zero());
        sensors.record_mutations_at(&applied, 20.0, 0);
        assert!(sensors.mutation_throttle_at(&applied, 0).is_zero());
        // Over once: 30 more leave it 28 below zero, 14 s of filling.
        sensors.record_mutations_at(&applied, 30.0, 0);
        assert_eq!(
            sensors.mutation_throttle_at(&applied, 0),
            Duration::from_secs(14)
        );
        assert_eq!(
            sensors.mutation_throttle_at(&applied, 4_000),
            Duration::from_secs(10)
        );
        assert!(sensors.mutation_throttle_at(&applied, 14_000).is_zero());
        // Full again after long enough, never over a window's worth.
        assert!(sensors.mutation_throttle_at(&applied, 100_000).is_zero());
        sensors.record_mutations_at(&applied, 22.0, 100_000);
        assert!(sensors.mutation_throttle_at(&applied, 100_000).is_zero());
        sensors.record_mutations_at(&applied, 1.0, 100_000);
        assert_eq!(
            sensors.mutation_throttle_at(&applied, 100_000),
            Duration::from_millis(500)
        );
    }
}
