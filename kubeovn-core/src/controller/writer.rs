//! Group commit of northbound writes: concurrent handlers hand in small batches, one task merges what
//! arrived within a short window (and while the previous transaction was in flight) into one transaction.
//!
//! A merged transaction that fails is retried batch by batch, so one bad request fails only its sender. A
//! northbound connection error fails every sender at once instead: retrying batch by batch would wait out the
//! outage once per batch. Their handlers retry, and [`Northbound::commit`] plans each retry against a replica
//! resumed on the new connection, so a change whose outcome was unknown is re-checked rather than resent blindly
//! (see `kubeovn_ovn` `write_client` for the case this does not cover: a request a stalled server commits late).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kubeovn_ovn::northbound::{Batch, Northbound, Op};
use tokio::sync::{mpsc, oneshot};

use super::error::{ControllerError, Result};
use super::metrics::Metrics;

/// How the writer groups batches.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// How long to wait for more batches after the first one arrives.
    pub window: Duration,
    /// Stop collecting once this many ops are gathered.
    pub max_ops: usize,
    /// Requests waiting before senders are slowed down.
    pub queue: usize,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            window: Duration::from_millis(2),
            max_ops: 4096,
            queue: 8192,
        }
    }
}

struct Job {
    batch: Batch,
    done: oneshot::Sender<Result<()>>,
}

/// A handle to the writer task; cheap to clone.
#[derive(Clone)]
pub struct NbWriter {
    tx: mpsc::Sender<Job>,
}

impl std::fmt::Debug for NbWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbWriter").finish_non_exhaustive()
    }
}

impl NbWriter {
    /// Starts the writer task on the current runtime; it ends when every handle is dropped.
    pub fn spawn(nb: Arc<dyn Northbound>, config: WriterConfig, metrics: Option<Metrics>) -> Self {
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        tokio::spawn(run(nb, config, metrics, rx));
        NbWriter { tx }
    }

    /// Commits `batch` (possibly together with others); returns once the replica shows it.
    pub async fn commit(&self, batch: Batch) -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let (done, rx) = oneshot::channel();
        self.tx
            .send(Job { batch, done })
            .await
            .map_err(|_| ControllerError::Stopped)?;
        rx.await.map_err(|_| ControllerError::Stopped)?
    }
}

async fn run(
    nb: Arc<dyn Northbound>,
    config: WriterConfig,
    metrics: Option<Metrics>,
    mut rx: mpsc::Receiver<Job>,
) {
    let mut jobs: Vec<Job> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut ops = first.batch.len();
        jobs.push(first);
        let deadline = tokio::time::Instant::now() + config.window;
        while ops < config.max_ops {
            // Take what is already queued without waiting, then wait out the window.
            let next = match rx.try_recv() {
                Ok(j) => Some(j),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                Err(mpsc::error::TryRecvError::Empty) => {
                    tokio::time::timeout_at(deadline, rx.recv())
                        .await
                        .unwrap_or_default()
                }
            };
            let Some(j) = next else { break };
            ops += j.batch.len();
            jobs.push(j);
        }
        commit_all(nb.as_ref(), metrics.as_ref(), &mut jobs).await;
    }
}

/// One batch from many. Additions to one port group become one op, placed after everything else (the
/// ports they name are created earlier in the batch): the planner reads a group's members once per op, so
/// one op per pod would cost O(members) each.
pub fn merge<'a>(batches: impl IntoIterator<Item = &'a Batch>) -> Batch {
    let mut merged = Batch::new();
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for b in batches {
        for op in &b.ops {
            match op {
                Op::PortGroupAdd { group, ports } => {
                    let i = *index.entry(group.clone()).or_insert_with(|| {
                        groups.push((group.clone(), Vec::new()));
                        groups.len() - 1
                    });
                    groups[i].1.extend(ports.iter().cloned());
                }
                other => merged.ops.push(other.clone()),
            }
        }
    }
    for (group, ports) in groups {
        merged.ops.push(Op::PortGroupAdd { group, ports });
    }
    merged
}

async fn commit_one(nb: &dyn Northbound, metrics: Option<&Metrics>, batch: Batch) -> Result<()> {
    let ops = batch.len();
    let t = Instant::now();
    let r = nb.commit(batch).await;
    if let Some(m) = metrics {
        m.nb_transaction(t.elapsed(), ops, r.is_ok());
    }
    r.map_err(ControllerError::from)
}

async fn commit_all(nb: &dyn Northbound, metrics: Option<&Metrics>, jobs: &mut Vec<Job>) {
    if jobs.len() == 1 {
        if let Some(j) = jobs.pop() {
            let r = commit_one(nb, metrics, j.batch).await;
            let _ = j.done.send(r);
        }
        return;
    }
    let merged = merge(jobs.iter().map(|j| &j.batch));
    match commit_one(nb, metrics, merged).await {
        Ok(()) => {
            for j in jobs.drain(..) {
                let _ = j.done.send(Ok(()));
            }
        }
        Err(e) if e.is_nb_connection_error() => fail_all(jobs, &e),
        Err(e) => {
            tracing::debug!(error = %e, batches = jobs.len(), "merged northbound transaction failed, retrying one by one");
            while !jobs.is_empty() {
                let j = jobs.remove(0);
                let r = commit_one(nb, metrics, j.batch).await;
                let lost = r
                    .as_ref()
                    .err()
                    .filter(|e| e.is_nb_connection_error())
                    .cloned();
                let _ = j.done.send(r);
                if let Some(e) = lost {
                    fail_all(jobs, &e);
                }
            }
        }
    }
}

/// Answers every job with `e` (a connection error: each sender retries).
fn fail_all(jobs: &mut Vec<Job>, e: &ControllerError) {
    for j in jobs.drain(..) {
        let _ = j.done.send(Err(e.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeovn_ovn::northbound::{MockNorthbound, SwitchPort};
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn port(name: &str) -> Batch {
        let mut b = Batch::new();
        b.delete_switch_port(name);
        b
    }

    #[tokio::test]
    async fn concurrent_batches_share_one_transaction() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut nb = MockNorthbound::new();
        let c = calls.clone();
        nb.expect_commit().returning(move |b| {
            c.fetch_add(1, Ordering::SeqCst);
            assert_eq!(b.len(), 20);
            Ok(())
        });
        let w = NbWriter::spawn(
            Arc::new(nb),
            WriterConfig {
                window: Duration::from_millis(200),
                max_ops: 20,
                queue: 100,
            },
            None,
        );
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let w = w.clone();
                tokio::spawn(async move { w.commit(port(&format!("p{i}"))).await })
            })
            .collect();
        for t in tasks {
            t.await.expect("join").expect("committed");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn merge_groups_port_group_additions_last() {
        let mut a = Batch::new();
        a.add(SwitchPort::new("ls", "p1"));
        a.port_group_add_ports("g1", ["p1"]);
        a.port_group_add_ports("g2", ["p1"]);
        let mut b = Batch::new();
        b.add(SwitchPort::new("ls", "p2"));
        b.port_group_add_ports("g1", ["p2"]);
        let m = merge([&a, &b]);
        assert!(matches!(&m.ops[0], Op::SwitchPort(p) if p.name == "p1"));
        assert!(matches!(&m.ops[1], Op::SwitchPort(p) if p.name == "p2"));
        assert_eq!(
            m.ops[2..],
            [
                Op::PortGroupAdd {
                    group: "g1".into(),
                    ports: vec!["p1".into(), "p2".into()]
                },
                Op::PortGroupAdd {
                    group: "g2".into(),
                    ports: vec!["p1".into()]
                },
            ]
        );
    }

    /// Three single-op batches committed at once through a writer that merges up to three ops.
    async fn three(nb: MockNorthbound, names: [&str; 3]) -> [Result<()>; 3] {
        let w = NbWriter::spawn(
            Arc::new(nb),
            WriterConfig {
                window: Duration::from_millis(100),
                max_ops: 3,
                queue: 10,
            },
            None,
        );
        let (a, b, c) = tokio::join!(
            w.commit(port(names[0])),
            w.commit(port(names[1])),
            w.commit(port(names[2]))
        );
        [a, b, c]
    }

    /// A connection error on the merged transaction fails every sender at once (each retries on its own),
    /// without one transaction per batch against a northbound that is gone.
    #[tokio::test]
    async fn a_connection_error_fails_every_batch_at_once() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut nb = MockNorthbound::new();
        let c = calls.clone();
        nb.expect_commit().returning(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
            Err(kubeovn_ovn::Error::OutcomeUnknown("test".into()))
        });
        for r in three(nb, ["a", "b", "c"]).await {
            assert!(r.is_err_and(|e| e.is_nb_connection_error()));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// A batch the server refuses (a port on a switch that does not exist) fails alone: the merged
    /// transaction is retried one batch at a time, the others are committed.
    #[tokio::test]
    async fn a_bad_batch_fails_alone() {
        let db = kubeovn_ovn::memdb::MemDb::new_nb();
        let nb = db.northbound().await.expect("memdb northbound");
        kubeovn_ovn::northbound::LogicalSwitch::new("ls")
            .execute(&nb)
            .await
            .expect("switch");
        let nb = Arc::new(nb);
        let w = NbWriter::spawn(
            nb.clone(),
            WriterConfig {
                window: Duration::from_millis(100),
                max_ops: 3,
                queue: 10,
            },
            None,
        );
        let add = |switch: &str, name: &str| {
            let mut b = Batch::new();
            b.add(SwitchPort::new(switch, name));
            b
        };
        let (a, bad, c) = tokio::join!(
            w.commit(add("ls", "a")),
            w.commit(add("missing", "bad")),
            w.commit(add("ls", "c"))
        );
        assert!(a.is_ok() && c.is_ok(), "{a:?} {c:?}");
        assert!(bad.is_err());
        assert!(nb.switch_port("a").is_some() && nb.switch_port("c").is_some());
        assert!(nb.switch_port("bad").is_none());
    }
}
