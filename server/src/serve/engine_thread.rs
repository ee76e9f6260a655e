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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
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
    /// Requests the engine has finished, for any reason.
    pub finished: AtomicU64,
    /// Steps that failed in a row.
    pub consecutive_failures: AtomicU32,
    /// Set once the thread has exited.
    pub stopped: AtomicBool,
    /// Set when it exited by a panic.
    pub panicked: AtomicBool,
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
        let (etx, erx) = tmpsc::unbounded_channel();
        let (rtx, rrx) = oneshot::channel();
        self.tx.send(Command::Add { req, sampler, events: etx, reply: rtx }).map_err(|_| SubmitError::EngineGone)?;
        match rrx.await {
            Ok(Ok(())) => Ok(erx),
            Ok(Err(r)) => Err(SubmitError::Rejected(r)),
            Err(_) => Err(SubmitError::EngineGone),
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

/// Starts the engine thread. `on_fatal` runs on that thread after a panic has ended the loop
/// and every open request has been told.
pub fn spawn(core: EngineCore, origin: Instant, on_fatal: Option<OnFatal>) -> std::io::Result<EngineHandle> {
    let (tx, rx) = mpsc::channel();
    let gauges = Arc::new(EngineGauges::default());
    let g = gauges.clone();
    std::thread::Builder::new().name("pace-engine".into()).spawn(move || {
        let mut lp = EngineLoop { core, rx, channels: HashMap::new(), first_scheduled: HashMap::new(), gauges: g, shutting_down: false };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lp.run()));
        if let Err(panic) = result {
            let msg = crate::engine::panic_message(panic.as_ref());
            tracing::error!("the engine thread panicked: {msg}; failing every open request");
            // Health turns red before anyone hears of the failure.
            lp.gauges.panicked.store(true, Ordering::Release);
            lp.gauges.stopped.store(true, Ordering::Release);
            lp.fail_all();
            // Submissions still queued get `EngineGone` (503) as the receiver goes.
            drop(lp);
            if let Some(f) = on_fatal {
                f(msg);
            }
        }
    })?;
    Ok(EngineHandle { tx, origin, next_id: Arc::new(AtomicU64::new(1)), gauges })
}

struct EngineLoop {
    core: EngineCore,
    rx: mpsc::Receiver<Command>,
    channels: HashMap<RequestId, tmpsc::UnboundedSender<EngineEvent>>,
    /// Arrival of requests not yet scheduled, for the queue-time histogram.
    first_scheduled: HashMap<RequestId, f64>,
    gauges: Arc<EngineGauges>,
    shutting_down: bool,
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

    /// After a panic: every open request ends as an error (its handler writes an error event or
    /// a 500), and the queued commands are dropped.
    fn fail_all(&mut self) {
        for (_, tx) in self.channels.drain() {
            let _ = tx.send(EngineEvent::Finished { reason: FinishReason::Error });
        }
        self.first_scheduled.clear();
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Add { req, sampler, events, reply } => {
                let (id, arrival) = (req.id, req.arrival);
                match self.core.add(req, sampler) {
                    Ok(()) => {
                        self.channels.insert(id, events);
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
        let report = self.core.step();
        let now = self.core.now();
        if !self.first_scheduled.is_empty() {
            for (id, start) in self.core.last_plan() {
                if let Some(arrival) = self.first_scheduled.remove(&id) {
                    let at = now - report.exec_secs;
                    metrics::record_queue_time(at - arrival);
                    if let Some(tx) = self.channels.get(&id) {
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
                if let Some(tx) = self.channels.get(&id) {
                    if tx.send(EngineEvent::Token { sampled }).is_err() {
                        // The handler is gone without telling us (it always aborts on drop, so
                        // this is a race with that abort): end the request now.
                        if let Some(ev) = self.core.abort(id) {
                            self.dispatch(ev);
                        }
                    }
                }
            }
            Event::Finished { id, reason, .. } => {
                self.first_scheduled.remove(&id);
                if let Some(tx) = self.channels.remove(&id) {
                    let _ = tx.send(EngineEvent::Finished { reason });
                }
            }
        }
    }

    fn publish(&self) {
        let s = self.core.scheduler().stats();
        self.gauges.waiting.store(s.waiting, Ordering::Relaxed);
        self.gauges.running.store(s.running, Ordering::Relaxed);
        let f = &s.finished;
        self.gauges.finished.store(f.stop + f.length + f.abort + f.dropped + f.error, Ordering::Relaxed);
        self.gauges.consecutive_failures.store(self.core.consecutive_failures(), Ordering::Relaxed);
        metrics::publish_engine(&s);
    }
}
