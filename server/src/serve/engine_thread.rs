//! The engine thread and the handle HTTP handlers use to reach it.
//!
//! One OS thread owns the [`EngineCore`] (scheduler + runner) and is the only code that touches
//! request state. Handlers send it commands (add, abort, stop) over a channel and receive each
//! request's events on that request's own channel. The thread steps the model while there is
//! work and sleeps on the command channel otherwise.
//!
//! The whole loop is supervised: a panic anywhere in it (the scheduler, command handling, the
//! bookkeeping after a step; a panic inside the model step is caught closer, by
//! [`EngineCore::step`], and fails only that step) ends every open request with an error,
//! refuses the submissions still queued, marks the engine stopped (so `/health` answers 503)
//! and calls the `on_fatal` hook given to [`spawn`] (`pace serve` exits non-zero from it, for
//! an orchestrator to restart the process).
//!
//! A watchdog thread beside it catches what supervision cannot: a step that never returns (a
//! deadlocked kernel, an infinite loop). Once one step has run for the step timeout it does
//! the same as a panic, from outside the stuck thread: health red, every open request ended
//! with an error, new submissions refused, `on_fatal`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pace_models::sampler::Sampler;
use pace_scheduler::{Event, FinishReason, NewRequest, Rejection, RequestId, SampledToken};
use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::engine::EngineCore;
use crate::serve::metrics;

/// What a request's channel carries.
#[derive(Debug, Clone)]
pub enum EngineEvent {
    /// A token was sampled.
    Token { sampled: SampledToken },
    /// The request was scheduled for the first time at engine time `at` (the end of its queue
    /// time, the start of its prefill), with `cached_tokens` of its prompt from the prefix cache.
    Scheduled { at: f64, cached_tokens: usize },
    /// The request ended.
    Finished { reason: FinishReason },
}

// An `Add` is large (the request and its sampler) and the others small; commands are few and
// short-lived, so boxing would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Command {
    Add { req: NewRequest, sampler: Sampler, events: tmpsc::UnboundedSender<EngineEvent>, reply: oneshot::Sender<Result<(), Rejection>> },
    Abort(RequestId),
    Stop(RequestId),
    Shutdown,
}

/// Load figures the engine publishes after every step, for cheap checks outside the thread.
#[derive(Debug, Default)]
pub struct EngineGauges {
    /// Requests waiting (preempted included).
    pub waiting: AtomicUsize,
    /// Requests running.
    pub running: AtomicUsize,
    /// Prompt tokens still to prefill (waiting and running requests').
    pub queued_tokens: AtomicUsize,
    /// Tokens the running requests hold.
    pub running_tokens: AtomicUsize,
    /// Seconds until a request arriving now would start, in microseconds.
    pub predicted_wait_us: AtomicU64,
    /// Requests the engine has finished, for any reason.
    pub finished: AtomicU64,
    /// Steps that failed in a row.
    pub consecutive_failures: AtomicU32,
    /// Set once the thread has exited.
    pub stopped: AtomicBool,
    /// Set when it exited by a panic.
    pub panicked: AtomicBool,
    /// Milliseconds since the thread started (plus one) at which the step in progress began;
    /// 0 between steps. The watchdog reads it.
    pub step_started_ms: AtomicU64,
    /// Set when the watchdog found a step that made no progress for the step timeout.
    pub hung: AtomicBool,
    /// Woken once when the engine stops for good (panic or watchdog), for submissions waiting
    /// on a thread that will never answer them.
    pub dead: tokio::sync::Notify,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    origin: Instant,
    next_id: Arc<AtomicU64>,
    /// Published load figures.
    pub gauges: Arc<EngineGauges>,
}

/// Why a submission did not start.
#[derive(Debug)]
pub enum SubmitError {
    /// The scheduler refused it.
    Rejected(Rejection),
    /// The engine thread is gone.
    EngineGone,
}

impl EngineHandle {
    /// Engine-clock seconds now (the clock every timestamp of the server uses).
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// A fresh request id.
    pub fn next_id(&self) -> RequestId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Submits a request; resolves once admission has decided. On success, the receiver yields
    /// the request's events until `Finished`.
    pub async fn submit(&self, req: NewRequest, sampler: Sampler) -> Result<tmpsc::UnboundedReceiver<EngineEvent>, SubmitError> {
        let dead = self.gauges.dead.notified();
        tokio::pin!(dead);
        dead.as_mut().enable();
        if self.gauges.stopped.load(Ordering::Acquire) {
            return Err(SubmitError::EngineGone);
        }
        let (etx, erx) = tmpsc::unbounded_channel();
        let (rtx, rrx) = oneshot::channel();
        self.tx.send(Command::Add { req, sampler, events: etx, reply: rtx }).map_err(|_| SubmitError::EngineGone)?;
        tokio::select! {
            r = rrx => match r {
                Ok(Ok(())) => Ok(erx),
                Ok(Err(r)) => Err(SubmitError::Rejected(r)),
                Err(_) => Err(SubmitError::EngineGone),
            },
            _ = dead => Err(SubmitError::EngineGone),
        }
    }

    /// The client went away: abort the request (its blocks are freed in the next step).
    pub fn abort(&self, id: RequestId) {
        let _ = self.tx.send(Command::Abort(id));
    }

    /// The server matched a stop string: finish the request as `stop`.
    pub fn stop(&self, id: RequestId) {
        let _ = self.tx.send(Command::Stop(id));
    }

    /// Asks the thread to exit once its requests have ended.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
}

/// What the engine thread calls, with the panic's message, after a panic has ended it.
pub type OnFatal = Box<dyn FnOnce(String) + Send>;

/// Each open request's event channel, shared with the watchdog so that it can end them while
/// the engine thread is stuck.
type Channels = Arc<Mutex<HashMap<RequestId, tmpsc::UnboundedSender<EngineEvent>>>>;

/// Ends every open request with an error (its handler writes an error event or a 500).
fn fail_all(channels: &Channels) {
    let mut map = channels.lock().unwrap_or_else(|e| e.into_inner());
    for (_, tx) in map.drain() {
        let _ = tx.send(EngineEvent::Finished { reason: FinishReason::Error });
    }
}

/// Starts the engine thread. `on_fatal` runs after a panic has ended the loop, or the watchdog
/// has found a step stuck for `step_timeout`, and every open request has been told.
pub fn spawn(core: EngineCore, origin: Instant, on_fatal: Option<OnFatal>, step_timeout: Option<Duration>) -> std::io::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel();
    let gauges = Arc::new(EngineGauges::default());
    let channels: Channels = Arc::default();
    let on_fatal = Arc::new(Mutex::new(on_fatal));
    let epoch = Instant::now();
    let (g, ch, fatal) = (gauges.clone(), channels.clone(), on_fatal.clone());
    std::thread::Builder::new().name("pace-engine".into()).spawn(move || {
        let mut lp = EngineLoop { core, rx, channels: ch, first_scheduled: HashMap::new(), gauges: g, shutting_down: false, epoch };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lp.run()));
        if let Err(panic) = result {
            let msg = crate::engine::panic_message(panic.as_ref());
            tracing::error!("the engine thread panicked: {msg}; failing every open request");
            // Health turns red before anyone hears of the failure.
            lp.gauges.panicked.store(true, Ordering::Release);
            lp.gauges.stopped.store(true, Ordering::Release);
            lp.gauges.dead.notify_waiters();
            fail_all(&lp.channels);
            lp.first_scheduled.clear();
            // Submissions still queued get `EngineGone` (503) as the receiver goes.
            drop(lp);
            let f = fatal.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(f) = f {
                f(msg);
            }
        }
    })?;
    if let Some(timeout) = step_timeout.filter(|t| !t.is_zero()) {
        let g = gauges.clone();
        let period = (timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        std::thread::Builder::new().name("pace-watchdog".into()).spawn(move || loop {
            std::thread::sleep(period);
            if g.stopped.load(Ordering::Acquire) {
                return;
            }
            let started = g.step_started_ms.load(Ordering::Acquire);
            let now = epoch.elapsed().as_millis() as u64 + 1;
            if started == 0 || now.saturating_sub(started) < timeout.as_millis() as u64 {
                continue;
            }
            let msg = format!("an engine step has made no progress for {:.0} s (--engine-step-timeout)", timeout.as_secs_f64());
            tracing::error!("{msg}; failing every open request");
            g.hung.store(true, Ordering::Release);
            g.stopped.store(true, Ordering::Release);
            g.dead.notify_waiters();
            fail_all(&channels);
            let f = on_fatal.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(f) = f {
                f(msg);
            }
            return;
        })?;
    }
    Ok(EngineHandle { tx, origin, next_id: Arc::new(AtomicU64::new(1)), gauges })
}

struct EngineLoop {
    core: EngineCore,
    rx: mpsc::Receiver<Command>,
    channels: Channels,
    /// Arrival of requests not yet scheduled, for the queue-time histogram.
    first_scheduled: HashMap<RequestId, f64>,
    gauges: Arc<EngineGauges>,
    shutting_down: bool,
    /// The zero of `EngineGauges::step_started_ms`.
    epoch: Instant,
}

impl EngineLoop {
    fn run(&mut self) {
        loop {
            // Idle: sleep on the channel (waking now and then to publish gauges).
            if !self.core.has_work() {
                if self.shutting_down {
                    break;
                }
                match self.rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(cmd) => self.handle(cmd),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            while let Ok(cmd) = self.rx.try_recv() {
                self.handle(cmd);
            }
            if self.core.has_work() {
                self.step();
            }
            self.publish();
        }
        self.gauges.stopped.store(true, Ordering::Release);
    }

    /// The open requests' channels (the lock is shared only with the watchdog).
    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<RequestId, tmpsc::UnboundedSender<EngineEvent>>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { req, sampler, events, reply } => {
                let (id, arrival) = (req.id, req.arrival);
                match self.core.add(req, sampler) {
                    Ok(()) => {
                        self.channels().insert(id, events);
                        self.first_scheduled.insert(id, arrival);
                        if reply.send(Ok(())).is_err() {
                            // The client left while admission was being decided: nobody will
                            // read this request, so it must not queue or run.
                            if let Some(ev) = self.core.abort(id) {
                                self.dispatch(ev);
                            }
                        }
                    }
                    Err(r) => {
                        let _ = reply.send(Err(r));
                    }
                }
            }
            Command::Abort(id) => {
                if let Some(ev) = self.core.abort(id) {
                    self.dispatch(ev);
                }
            }
            Command::Stop(id) => {
                if let Some(ev) = self.core.stop(id) {
                    self.dispatch(ev);
                }
            }
            Command::Shutdown => self.shutting_down = true,
        }
    }

    fn step(&mut self) {
        self.gauges.step_started_ms.store(self.epoch.elapsed().as_millis() as u64 + 1, Ordering::Release);
        let report = self.core.step();
        self.gauges.step_started_ms.store(0, Ordering::Release);
        let now = self.core.now();
        if !self.first_scheduled.is_empty() {
            for (id, start) in self.core.last_plan() {
                if let Some(arrival) = self.first_scheduled.remove(&id) {
                    let at = now - report.exec_secs;
                    metrics::record_queue_time(at - arrival);
                    if let Some(tx) = self.channels().get(&id) {
                        // Its first slice starts after the prefix it found cached (read from the
                        // plan: a request that finished in this step is gone from the scheduler).
                        let _ = tx.send(EngineEvent::Scheduled { at, cached_tokens: start });
                    }
                }
            }
        }
        if let Some(e) = &report.error {
            tracing::error!("engine step failed ({} requests failed with it): {e}", report.num_seqs);
        } else if report.num_seqs > 0 {
            metrics::record_step(report.exec_secs, report.predicted_secs, report.num_tokens);
        }
        if report.broken_rows > 0 {
            tracing::error!("{} requests failed: the model's logits for them were not finite (NaN or +inf)", report.broken_rows);
            metrics::record_broken_logits(report.broken_rows);
        }
        for &e in &report.length_errors {
            metrics::record_length_error(e);
        }
        for ev in report.events {
            self.dispatch(ev);
        }
    }

    fn dispatch(&mut self, ev: Event) {
        match ev {
            Event::Token { id, sampled, .. } => {
                let gone = self.channels().get(&id).is_some_and(|tx| tx.send(EngineEvent::Token { sampled }).is_err());
                if gone {
                    // The handler is gone without telling us (it always aborts on drop, so this
                    // is a race with that abort): end the request now.
                    if let Some(ev) = self.core.abort(id) {
                        self.dispatch(ev);
                    }
                }
            }
            Event::Finished { id, reason, .. } => {
                self.first_scheduled.remove(&id);
                let tx = self.channels().remove(&id);
                if let Some(tx) = tx {
                    let _ = tx.send(EngineEvent::Finished { reason });
                }
            }
        }
    }

    fn publish(&self) {
        let s = self.core.scheduler().stats();
        self.gauges.waiting.store(s.waiting, Ordering::Relaxed);
        self.gauges.running.store(s.running, Ordering::Relaxed);
        self.gauges.queued_tokens.store(s.queued_tokens, Ordering::Relaxed);
        self.gauges.running_tokens.store(s.running_tokens, Ordering::Relaxed);
        self.gauges.predicted_wait_us.store((s.predicted_wait_s * 1e6).min(u64::MAX as f64) as u64, Ordering::Relaxed);
        let f = &s.finished;
        self.gauges.finished.store(f.stop + f.length + f.abort + f.dropped + f.error, Ordering::Relaxed);
        self.gauges.consecutive_failures.store(self.core.consecutive_failures(), Ordering::Relaxed);
        metrics::publish_engine(&s);
    }
}
