//! The order of effects on one connection.
//!
//! Kafka handles one request of a connection at a time, so every request sees what the earlier
//! ones did, and clients depend on it (a ListOffsets right behind a DeleteRecords sees the new
//! log start offset). Sluice runs a connection's requests as concurrent tasks, for one reason:
//! pipelined produces must share fdatasyncs (group commit). So each request takes a [`Turn`]
//! in a chain, in the order the requests were read:
//!
//! - a produce starts once every earlier request is *in order*, and is in order itself once
//!   each of its batches holds its place in its log's append order (`Log::append_signalling`):
//!   the next produce may then append behind it while it waits for its fdatasync;
//! - every other request starts once every earlier request is *done* (its effects applied and
//!   visible: an earlier produce acknowledged), and is in order once it is done itself.
//!
//! A request that is done is in order; each signal fires only after the earlier request's same
//! signal, so it covers every request before it. Signals are oneshot channels: a request that
//! ends any way, or whose task is dropped with its connection, drops its senders and so lets
//! the next one go. All of it lives on the connection's shard.

use futures_channel::oneshot;

/// The connection's end of the chain: what the next request read waits for.
#[derive(Default)]
pub struct Chain {
    in_order: Option<oneshot::Receiver<()>>,
    done: Option<oneshot::Receiver<()>>,
}

impl Chain {
    /// The turn of the next request read from the connection.
    pub fn next(&mut self) -> Turn {
        let (in_order_tx, in_order_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        Turn {
            earlier_in_order: self.in_order.replace(in_order_rx),
            earlier_done: self.done.replace(done_rx),
            in_order: Some(in_order_tx),
            done: Some(done_tx),
        }
    }
}

/// One request's place in its connection's chain.
pub struct Turn {
    earlier_in_order: Option<oneshot::Receiver<()>>,
    earlier_done: Option<oneshot::Receiver<()>>,
    in_order: Option<oneshot::Sender<()>>,
    done: Option<oneshot::Sender<()>>,
}

impl Turn {
    /// Waits until every earlier request of the connection is in order.
    pub async fn after_earlier_in_order(&mut self) {
        if let Some(rx) = self.earlier_in_order.as_mut() {
            // A dropped sender is a signal too: the earlier request ended.
            let _ = rx.await;
        }
        self.earlier_in_order = None;
    }

    /// Waits until every earlier request of the connection is done.
    pub async fn after_earlier_done(&mut self) {
        if let Some(rx) = self.earlier_done.as_mut() {
            let _ = rx.await;
        }
        self.earlier_done = None;
        // Done implies in order.
        self.earlier_in_order = None;
    }

    /// This request's effects hold their place: later produces may start. Only after the
    /// earlier requests are in order.
    pub fn in_order(&mut self) {
        assert!(
            self.earlier_in_order.is_none(),
            "a request is in order only after every earlier one"
        );
        self.in_order = None;
    }

    /// This request is done: later requests of any kind may start. Waits for the earlier ones
    /// first, so the signal covers them too.
    pub async fn finish(mut self) {
        self.after_earlier_in_order().await;
        self.in_order();
        self.after_earlier_done().await;
        self.done = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future::{block_on, poll_once};

    #[test]
    fn a_request_waits_for_the_signals_of_the_one_before() {
        block_on(async {
            let mut chain = Chain::default();
            let mut first = chain.next();
            let mut second = chain.next();
            first.after_earlier_done().await;
            assert!(poll_once(second.after_earlier_in_order()).await.is_none());
            first.in_order();
            assert!(poll_once(second.after_earlier_in_order()).await.is_some());
            assert!(poll_once(second.after_earlier_done()).await.is_none());
            first.finish().await;
            assert!(poll_once(second.after_earlier_done()).await.is_some());
        });
    }

    #[test]
    fn a_dropped_request_lets_the_next_one_go() {
        block_on(async {
            let mut chain = Chain::default();
            let first = chain.next();
            let mut second = chain.next();
            drop(first);
            second.after_earlier_done().await;
            second.finish().await;
        });
    }
}
