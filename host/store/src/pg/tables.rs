//! What PostgreSQL keeps beside its tables (which are written once, `once.rs`): the
//! notifications other instances send.

use super::PgDb;

impl PgDb {
    /// Payloads of notifications on `channel`, from a connection of its own that is opened
    /// again (after a pause) whenever it is lost; ends when the receiver is dropped.
    pub fn listen(&self, channel: &'static str) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let config = self.config.clone();
        tokio::spawn(async move {
            while !tx.is_closed() {
                if let Ok((client, mut conn)) = config.connect(tokio_postgres::NoTls).await {
                    let (ntx, mut nrx) = tokio::sync::mpsc::unbounded_channel();
                    let pump = tokio::spawn(async move {
                        let mut stream = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
                        use futures::StreamExt;
                        while let Some(Ok(m)) = stream.next().await {
                            if let tokio_postgres::AsyncMessage::Notification(n) = m
                                && ntx.send(n.payload().to_string()).is_err()
                            {
                                break;
                            }
                        }
                    });
                    if client
                        .batch_execute(&format!("LISTEN {channel}"))
                        .await
                        .is_ok()
                    {
                        // A reconnect may have missed notifications: say "look" once.
                        let _ = tx.send(String::new());
                        while let Some(p) = nrx.recv().await {
                            if tx.send(p).is_err() {
                                break;
                            }
                        }
                    }
                    pump.abort();
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        rx
    }
}
