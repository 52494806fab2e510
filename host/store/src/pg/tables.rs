//! The app's tables ([`crate::tables`]) in PostgreSQL: jobs shared by every instance,
//! sources and per-session settings (tokens and the event log are written once, `once.rs`).

use async_trait::async_trait;

use super::{LOCK, PgDb, PgStore};
use crate::tables::SlotStore;
use crate::types::Error;

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

#[async_trait]
impl SlotStore for PgStore {
    fn slots_shared(&self) -> bool {
        true
    }

    async fn slot_take(
        &self,
        pool: &str,
        owner: &str,
        max: usize,
        now_ms: u64,
        until_ms: u64,
    ) -> Result<Option<u64>, Error> {
        let mut c = self.client().await?;
        let tx = c.transaction().await.map_err(|e| self.err(e))?;
        // Takers of one pool take turns, so the count and the insert are one step.
        tx.execute(LOCK, &[&format!("slots:{pool}")])
            .await
            .map_err(|e| self.err(e))?;
        let now = now_ms as i64;
        tx.execute(
            "DELETE FROM model_slots WHERE tenant = $1 AND until_ms <= $2",
            &[&pool, &now],
        )
        .await
        .map_err(|e| self.err(e))?;
        let held: i64 = tx
            .query_one(
                "SELECT COUNT(*) FROM model_slots WHERE tenant = $1",
                &[&pool],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        if held as usize >= max {
            return Ok(None);
        }
        let id: i64 = tx
            .query_one(
                "INSERT INTO model_slots (tenant, owner, until_ms) VALUES ($1, $2, $3) RETURNING id",
                &[&pool, &owner, &(until_ms as i64)],
            )
            .await
            .map_err(|e| self.err(e))?
            .get(0);
        tx.commit().await.map_err(|e| self.err(e))?;
        Ok(Some(id as u64))
    }

    async fn slot_release(&self, id: u64) -> Result<(), Error> {
        self.exec("DELETE FROM model_slots WHERE id = $1", &[&(id as i64)])
            .await
            .map(drop)
    }

    async fn slot_renew(&self, owner: &str, until_ms: u64) -> Result<(), Error> {
        self.exec(
            "UPDATE model_slots SET until_ms = $2 WHERE owner = $1",
            &[&owner, &(until_ms as i64)],
        )
        .await
        .map(drop)
    }
}
