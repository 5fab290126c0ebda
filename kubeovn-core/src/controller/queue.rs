//! A keyed work queue with client-go's guarantees: a key waiting is queued once however often it is added,
//! and a key is never processed by two workers at once (an add during processing runs it again after).
//! Failed keys are retried with exponential backoff; so are keys whose handler panicked (the panic is caught,
//! the worker carries on).
//!
//! Delayed adds ([`WorkQueue::add_after`]) wait in one scheduler per queue, one pending entry per key (the
//! earliest wins), served by a single timer task on tokio's clock: tests pause and advance it
//! (`#[tokio::test(start_paused = true)]`) instead of sleeping.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::Metrics;

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    failures: HashMap<K, u32>,
    stopped: bool,
    /// Keys added with a delay, by due time (a sequence number keeps equal times apart).
    due: BTreeMap<(Instant, u64), K>,
    /// Each delayed key's entry in `due`: one per key.
    delayed: HashMap<K, (Instant, u64)>,
    seq: u64,
    /// Whether the timer task runs.
    timer: bool,
}

/// The queue; share it with `Arc`.
pub struct WorkQueue<K> {
    name: &'static str,
    state: Mutex<State<K>>,
    notify: Notify,
    /// Wakes the timer task when an earlier due time comes in, or at shutdown.
    timer_notify: Notify,
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
                due: BTreeMap::new(),
                delayed: HashMap::new(),
                seq: 0,
                timer: false,
            }),
            notify: Notify::new(),
            timer_notify: Notify::new(),
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

    /// Queues `key` after `delay`. A key already waiting for a delay keeps the earlier of the two times.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let at = Instant::now() + delay;
        let mut s = self.lock();
        if s.stopped {
            return;
        }
        if let Some(&(t, n)) = s.delayed.get(&key) {
            if t <= at {
                return;
            }
            s.due.remove(&(t, n));
        }
        let earliest = s.due.keys().next().is_none_or(|(t, _)| at < *t);
        s.seq += 1;
        let slot = (at, s.seq);
        s.due.insert(slot, key.clone());
        s.delayed.insert(key, slot);
        let start = !std::mem::replace(&mut s.timer, true);
        drop(s);
        if start {
            tokio::spawn(self.clone().timer());
        } else if earliest {
            self.timer_notify.notify_one();
        }
    }

    /// Keys waiting for a delay.
    pub fn delayed(&self) -> usize {
        self.lock().delayed.len()
    }

    /// When the next delayed key is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.lock().due.keys().next().map(|(t, _)| *t)
    }

    /// The timer task: queues delayed keys when due, until the queue shuts down.
    async fn timer(self: Arc<Self>) {
        loop {
            let notified = self.timer_notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let next = {
                let mut s = self.lock();
                if s.stopped {
                    s.timer = false;
                    return;
                }
                let now = Instant::now();
                let mut ready = Vec::new();
                while let Some(entry) = s.due.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let k = entry.remove();
                    s.delayed.remove(&k);
                    ready.push(k);
                }
                let next = s.due.keys().next().map(|(t, _)| *t);
                drop(s);
                for k in ready {
                    self.add(k);
                }
                next
            };
            match next {
                Some(t) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(t) => {}
                        _ = &mut notified => {}
                    }
                }
                None => notified.await,
            }
        }
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
        let mut s = self.lock();
        s.stopped = true;
        s.due.clear();
        s.delayed.clear();
        drop(s);
        self.notify.notify_waiters();
        self.timer_notify.notify_one();
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

    #[tokio::test(start_paused = true)]
    async fn a_delayed_key_waits_once_with_the_earliest_time() {
        let q: Arc<WorkQueue<&str>> = WorkQueue::new("t");
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(20));
        q.add_after("a", Duration::from_secs(5));
        q.add_after("b", Duration::from_secs(7));
        assert_eq!(q.delayed(), 2, "one pending entry per key");
        let start = Instant::now();
        assert_eq!(q.next_due(), Some(start + Duration::from_secs(5)));
        tokio::time::sleep(Duration::from_millis(4_999)).await;
        assert!(q.is_empty(), "not due yet");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(q.get().await, Some("a"), "the earliest time won");
        q.done(&"a");
        assert_eq!(q.delayed(), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.get().await, Some("b"));
        q.done(&"b");
        // The later times of "a" were dropped with its entry: nothing more comes.
        assert_eq!((q.delayed(), q.next_due()), (0, None));
        assert!(q.is_idle());
        // An earlier time given after a later one wakes the timer for it.
        q.add_after("c", Duration::from_secs(60));
        q.add_after("d", Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(1_001)).await;
        assert_eq!(q.get().await, Some("d"));
        q.shutdown();
        assert_eq!(q.delayed(), 0, "shutdown drops what waits");
    }

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

    #[tokio::test(start_paused = true)]
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
                let n = s.fetch_add(1, Ordering::SeqCst);
                if n < 200 {
                    q2.add(k % 5); // re-adds while processing (bounded, so the queue drains)
                }
                tokio::task::yield_now().await;
                b.lock().expect("lock").remove(&k);
                // Every key fails once, then succeeds.
                if n < 50 {
                    Err(true)
                } else {
                    Ok(())
                }
            }
        }));
        // Until every retry (backoff on paused time) and re-add has run.
        while !(q.is_idle() && q.delayed() == 0) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        q.shutdown();
        run.await.expect("join");
        assert_eq!(
            overlaps.load(Ordering::SeqCst),
            0,
            "a key was processed by two workers at once"
        );
        assert!(seen.load(Ordering::SeqCst) >= 200);
    }

    #[tokio::test(start_paused = true)]
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
