//! `sluice`: the Sluice broker binary. With no subcommand it serves the Kafka protocol.

fn main() -> anyhow::Result<()> {
    sluice_broker::main()
}
