//! A keyed work queue with client-go's guarantees: a key waiting is queued once however often it is added,
//! and a key is never processed by two workers at once (an add during processing runs it again after).
//! Failed keys are retried with exponential backoff; so are keys whose handler panicked (the panic is caught,
//! the worker carries on).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Notify;

use super::metrics::Metrics;

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    stopped: bool,
}

/// The queue; share it with `Arc`.
pub struct WorkQueue<K> {
    name: &'static str,
    state: Mutex<State<K>>,
    notify: Notify,
    /// Workers running.
    workers: AtomicUsize,
}

impl<K> std::fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// An empty queue called `name` (used in logs and metrics).
    pub fn new(name: &'static str) -> Arc<Self> {
        Arc::new(WorkQueue {
            name,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashSet::new(),
                failures: HashMap::new(),
                stopped: false,
            }),
            notify: Notify::new(),
            workers: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        // A panicking worker leaves consistent sets behind: every update is a single insert or remove.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Queues `key` unless it is already waiting.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.stopped || !s.dirty.insert(key.clone()) {
            return;
        }
        if !s.processing.contains(&key) {
            s.queue.push_back(key);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        let q = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// Keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether nothing is waiting and nothing is being processed.
    pub fn is_idle(&self) -> bool {
        let s = self.lock();
        s.queue.is_empty() && s.processing.is_empty()
    }

    /// Workers running now (those [`WorkQueue::run`] started and that have not ended).
    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::SeqCst)
    }

    /// Stops handing out keys; workers end.
    pub fn shutdown(&self) {
        self.lock().stopped = true;
        self.notify.notify_waiters();
    }

    /// The next key to process, None once shut down.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if s.stopped {
                    return None;
                }
                if let Some(k) = s.queue.pop_front() {
                    s.dirty.remove(&k);
                    s.processing.insert(k.clone());
                    if !s.queue.is_empty() {
                        // Chain the wake-up so idle workers pick up the rest.
                        self.notify.notify_one();
                    }
                    return Some(k);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` processed; it runs again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Records a failure of `key` and returns the backoff before its retry (5 ms doubling up to 5 min).
    pub fn fail(&self, key: &K) -> Duration {
        let mut s = self.lock();
        let n = s.failures.entry(key.clone()).or_insert(0);
        *n = n.saturating_add(1);
        let exp = (*n - 1).min(16);
        Duration::from_millis(5u64 << exp).min(Duration::from_secs(300))
    }

    /// Forgets the failures of `key`.
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Runs `concurrency` workers calling `handle` until the queue is shut down. A handler returning
    /// `Err(true)` is retried with backoff; `Err(false)` is dropped until the key is added again. A handler
    /// that panics is retried with backoff too, and counted in `metrics` (`handler_panics`) if given.
    pub async fn run<F, Fut>(
        self: Arc<Self>,
        concurrency: usize,
        metrics: Option<Metrics>,
        handle: F,
    ) where
        F: Fn(K) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), bool>> + Send + 'static,
    {
        let handle = Arc::new(handle);
        let workers: Vec<_> = (0..concurrency.max(1))
            .map(|_| {
                let q = self.clone();
                let handle = handle.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    let _running = Running::new(&q.workers);
                    while let Some(k) = q.get().await {
                        // Building the future may panic as well as polling it.
                        let (h, key) = (handle.clone(), k.clone());
                        let run = AssertUnwindSafe(async move { h(key).await });
                        match run.catch_unwind().await {
                            Ok(Ok(())) | Ok(Err(false)) => q.forget(&k),
                            Ok(Err(true)) => {
                                let d = q.fail(&k);
                                q.add_after(k.clone(), d);
                            }
                            Err(panic) => {
                                if let Some(m) = &metrics {
                                    m.handler_panic(q.name);
                                }
                                let d = q.fail(&k);
                                tracing::error!(
                                    queue = q.name,
                                    panic = panic_message(panic.as_ref()),
                                    retry_ms = d.as_millis() as u64,
                                    "handler panicked"
                                );
                                q.add_after(k.clone(), d);
                            }
                        }
                        q.done(&k);
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
    }
}

/// Counts a worker while it lives (also if it ends by a panic).
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::SeqCst);
        Running(n)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string payload")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn dedups_waiting_keys() {
        let q = WorkQueue::new("t");
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        // Added while processing: not handed out twice at once, queued again on done.
        q.add("a");
        assert_eq!(q.get().await, Some("b"));
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.get().await, Some("a"));
        q.shutdown();
        assert_eq!(q.get().await, None);
    }

    #[tokio::test]
    async fn backoff_grows_and_is_capped() {
        let q: Arc<WorkQueue<u32>> = WorkQueue::new("t");
        assert_eq!(q.fail(&1), Duration::from_millis(5));
        assert_eq!(q.fail(&1), Duration::from_millis(10));
        for _ in 0..40 {
            q.fail(&1);
        }
        assert_eq!(q.fail(&1), Duration::from_secs(300));
        q.forget(&1);
        assert_eq!(q.fail(&1), Duration::from_millis(5));
    }

    #[tokio::test]
    async fn workers_retry_failures_and_never_overlap_a_key() {
        let q: Arc<WorkQueue<u32>> = WorkQueue::new("t");
        let seen = Arc::new(AtomicUsize::new(0));
        let overlaps = Arc::new(AtomicUsize::new(0));
        let busy = Arc::new(Mutex::new(HashSet::new()));
        for k in 0..50 {
            q.add(k);
        }
        let (s, o, b) = (seen.clone(), overlaps.clone(), busy.clone());
        let q2 = q.clone();
        let run = tokio::spawn(q.clone().run(8, None, move |k: u32| {
            let (s, o, b, q2) = (s.clone(), o.clone(), b.clone(), q2.clone());
            async move {
                // Counted, not asserted here: a panic in a handler would not reach the test.
                if !b.lock().expect("lock").insert(k) {
                    o.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                q2.add(k % 5); // re-adds while processing
                tokio::task::yield_now().await;
                b.lock().expect("lock").remove(&k);
                // Every key fails once, then succeeds.
                if s.fetch_add(1, Ordering::SeqCst) < 50 {
                    Err(true)
                } else {
                    Ok(())
                }
            }
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
        q.shutdown();
        run.await.expect("join");
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "a key was processed by two workers at once"
        );
        assert!(seen.load(Ordering::SeqCst) >= 100);
    }

    #[tokio::test]
    async fn a_panicking_handler_is_caught_counted_and_retried() {
        let q: Arc<WorkQueue<u32>> = WorkQueue::new("t");
        let metrics = Metrics::new();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let c = calls.clone();
        let run = tokio::spawn(q.clone().run(2, Some(metrics.clone()), move |k: u32| {
            let c = c.clone();
            async move {
                let first = {
                    let mut c = c.lock().expect("lock");
                    c.push(k);
                    c.iter().filter(|&&x| x == k).count() == 1
                };
                // Key 1 panics on its first run (while key 2 keeps the other worker busy).
                if k == 1 && first {
                    panic!("handler bug");
                }
                Ok(())
            }
        }));
        q.add(1);
        q.add(2);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let done = {
                let c = calls.lock().expect("lock");
                c.iter().filter(|&&x| x == 1).count() == 2 && c.contains(&2)
            };
            if done && q.is_idle() {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "key 1 not retried after its panic: calls {:?}, idle {}",
                calls.lock().expect("lock"),
                q.is_idle()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(q.workers(), 2, "a worker was lost to the panic");
        // The workers still serve new keys.
        q.add(3);
        q.add(4);
        while !(calls.lock().expect("lock").contains(&4)
            && calls.lock().expect("lock").contains(&3))
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "new keys not served"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let text = metrics.encode();
        assert!(
            text.contains("kube_ovn_controller_handler_panics_total{kind=\"t\"} 1"),
            "{text}"
        );
        q.shutdown();
        run.await.expect("join");
        assert_eq!(q.workers(), 0);
    }
}
