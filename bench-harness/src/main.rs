//! `sluice-bench`: an OpenMessaging-Benchmark-style load generator for any Kafka-compatible
//! broker. Not built yet; see README.md for the plan. It must stay independent of Sluice's own
//! crates so that comparisons against Apache Kafka are fair.

fn main() {
    eprintln!("sluice-bench: the load generator is not built yet; see perf/README.md for the engine benchmark");
    std::process::exit(2);
}
