//! `sluice dev-cluster --nodes N`: a cluster of N combined nodes (broker and controller) on
//! loopback, in the foreground, for trying a cluster out. Each node is this same `sluice`
//! binary started with the flags README shows for a cluster on one host; their log lines come
//! out prefixed with the node id. Ctrl-C (or SIGTERM) stops every node cleanly.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::cluster::meta_properties::{self, MetaProperties};

#[derive(clap::Args, Debug)]
pub struct DevClusterArgs {
    /// Nodes to run, each a broker and a controller.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Where the nodes keep their data: one directory per node, `node-<id>`. Kept after a stop,
    /// so the next run starts the same cluster again.
    #[arg(long, default_value = "./dev-cluster")]
    data_dir: PathBuf,
    /// Node 1's client port; node i serves clients on this + i - 1, and its controller
    /// listener on this + 100 + i - 1.
    #[arg(long, default_value_t = 9092)]
    port: u16,
    /// Shards (cores) per node.
    #[arg(long, default_value_t = 1)]
    cores: usize,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

pub fn run(args: &DevClusterArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > 9 {
        anyhow::bail!("--nodes takes 1 to 9");
    }
    let exe = std::env::current_exe()?;
    let node_dir = |id: usize| args.data_dir.join(format!("node-{id}"));
    let cluster_id = match MetaProperties::read(&node_dir(1))? {
        Some(p) => p.cluster_id,
        None => meta_properties::random_id(),
    };
    let client_port = |id: usize| args.port + id as u16 - 1;
    let controller_port = |id: usize| args.port + 100 + id as u16 - 1;
    let voters: Vec<String> = (1..=args.nodes)
        .map(|id| format!("{id}@127.0.0.1:{}", controller_port(id)))
        .collect();
    let voters = voters.join(",");
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, on_signal as *const () as libc::sighandler_t);
        }
    }
    let mut children: Vec<(usize, Child)> = Vec::new();
    for id in 1..=args.nodes {
        meta_properties::format(&node_dir(id), &cluster_id, id as i32, true)?;
        let mut child = Command::new(&exe)
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--data-dir")
            .arg(node_dir(id))
            .arg("--listeners")
            .arg(format!(
                "PLAINTEXT://127.0.0.1:{},CONTROLLER://127.0.0.1:{}",
                client_port(id),
                controller_port(id)
            ))
            .arg("--controller-quorum-voters")
            .arg(&voters)
            .arg("--cores")
            .arg(args.cores.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting node {id}: {e}"))?;
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let mut err = std::io::stderr().lock();
                    let _ = writeln!(err, "[node {id}] {line}");
                }
            });
        }
        children.push((id, child));
    }
    let bootstrap: Vec<String> = (1..=args.nodes)
        .map(|id| format!("127.0.0.1:{}", client_port(id)))
        .collect();
    eprintln!(
        "dev-cluster: {} nodes of cluster {cluster_id} in {}\n  bootstrap servers: {}\n  \
         controller.quorum.voters: {voters}\n  Ctrl-C stops them.",
        args.nodes,
        args.data_dir.display(),
        bootstrap.join(",")
    );
    let mut failed = None;
    while !STOP.load(Ordering::SeqCst) && failed.is_none() {
        std::thread::sleep(Duration::from_millis(100));
        for (id, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                failed = Some((*id, status));
                break;
            }
        }
    }
    for (_, child) in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            // SAFETY: a signal to a child this process started and has not reaped.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    for (id, child) in children.iter_mut() {
        match child.wait() {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!("dev-cluster: node {id} exited with {status}"),
            Err(e) => eprintln!("dev-cluster: waiting for node {id}: {e}"),
        }
    }
    match failed {
        Some((id, status)) => anyhow::bail!("node {id} exited with {status}; stopped the others"),
        None => {
            eprintln!("dev-cluster: stopped");
            Ok(())
        }
    }
}
