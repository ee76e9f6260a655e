//! The engine core: the one owner of the scheduler and the model runner, and the step loop
//! `schedule → execute → update`.
//!
//! Time is the engine's own clock (seconds since it started), read here and passed into the
//! scheduler. A step that fails (an error or a panic inside the model) fails only the requests of
//! that step; the engine counts consecutive failures so that `/health` can report them.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use pace_models::runner::ModelRunner;
use pace_models::sampler::Sampler;
use pace_scheduler::block_pool::KvEvent;
use pace_scheduler::cost::StepShape;
use pace_scheduler::{BatchPlan, Event, NewRequest, Rejection, RequestId, Scheduler};

/// What one step did.
#[derive(Debug, Default)]
pub struct StepReport {
    /// Events for the requests (tokens, finishes).
    pub events: Vec<Event>,
    /// Tokens fed to the model.
    pub num_tokens: usize,
    /// Sequences in the batch.
    pub num_seqs: usize,
    /// Wall time of the model execution, seconds (0 if nothing ran).
    pub exec_secs: f64,
    /// The scheduler's prediction of that time, made before the step ran (0 if nothing ran).
    pub predicted_secs: f64,
    /// `expected / actual` output length of each request that stopped by itself in this step
    /// (the length model's prediction at admission).
    pub length_errors: Vec<f64>,
    /// The step's error, if it failed.
    pub error: Option<String>,
    /// Requests the step failed because their logits were not finite (NaN or +inf).
    pub broken_rows: usize,
}

/// Scheduler + runner + clock.
pub struct EngineCore {
    scheduler: Scheduler,
    runner: ModelRunner,
    plan: BatchPlan,
    origin: Instant,
    consecutive_failures: u32,
    /// Test hook (`--debug-fail-on-token`): a step that feeds this token fails as if the model
    /// had failed, so the failure path can be exercised end to end.
    fail_on_token: Option<u32>,
    /// Test hook (`--debug-panic-on-token`): a step that feeds this token panics after the model
    /// step, outside its guard, as a bug in the scheduler would.
    panic_on_token: Option<u32>,
    /// Test hook (`--debug-stall-on-token`): a step that feeds this token first sleeps this
    /// long, as a stalled GPU or a page-faulting host would.
    stall_on_token: Option<(u32, f64)>,
    /// One JSON line per executed step (its shape, predicted and measured seconds), for the
    /// cost model's offline study (`--step-trace`).
    step_trace: Option<std::io::LineWriter<std::fs::File>>,
    /// Receives each step's prefix-cache changes (`--kv-events-config`).
    kv_events: Option<KvEventHook>,
}

/// What [`EngineCore::kv_events`] hands a step's prefix-cache changes to.
pub type KvEventHook = Box<dyn FnMut(Vec<KvEvent>) + Send>;

impl EngineCore {
    /// An engine over a scheduler and a runner sized for each other.
    pub fn new(scheduler: Scheduler, runner: ModelRunner) -> Self {
        Self {
            scheduler,
            runner,
            plan: BatchPlan::default(),
            origin: Instant::now(),
            consecutive_failures: 0,
            fail_on_token: None,
            panic_on_token: None,
            stall_on_token: None,
            step_trace: None,
            kv_events: None,
        }
    }

    /// Uses `origin` as the clock's zero (so the HTTP side and the engine share one clock).
    pub fn with_origin(mut self, origin: Instant) -> Self {
        self.origin = origin;
        self
    }

    /// Makes every step that feeds `token` fail (a test hook for the failure path).
    pub fn fail_on_token(mut self, token: Option<u32>) -> Self {
        self.fail_on_token = token;
        self
    }

    /// Makes every step that feeds `token` panic outside the model step's guard (a test hook for
    /// the engine thread's supervision).
    pub fn panic_on_token(mut self, token: Option<u32>) -> Self {
        self.panic_on_token = token;
        self
    }

    /// Appends one JSON line per executed step to `file`.
    pub fn step_trace(mut self, file: Option<std::fs::File>) -> Self {
        self.step_trace = file.map(std::io::LineWriter::new);
        self
    }

    /// Gives every slice that feeds `token` NaN logits (a test hook for broken rows).
    pub fn nan_on_token(mut self, token: Option<u32>) -> Self {
        self.runner.set_nan_on_token(token);
        self
    }

    /// Makes every step that feeds `token` sleep `secs` seconds first (a test hook for stalls).
    pub fn stall_on_token(mut self, stall: Option<(u32, f64)>) -> Self {
        self.stall_on_token = stall;
        self
    }

    /// The requests in the last step's plan, each with the position its slice started at (for
    /// a request's first slice: the prompt tokens it found in the prefix cache).
    pub fn last_plan(&self) -> impl Iterator<Item = (RequestId, usize)> + '_ {
        self.plan.seqs.iter().map(|s| (s.id, s.start_pos))
    }

    /// Hand each step's prefix-cache changes, when there are any, to `hook` (it runs on the
    /// engine thread, after the step: it must not block).
    pub fn kv_events(mut self, hook: KvEventHook) -> Self {
        self.scheduler.record_kv_events();
        self.kv_events = Some(hook);
        self
    }

    /// Whether the model runs in host memory.
    pub fn runner_device_is_cpu(&self) -> bool {
        self.runner.model().device().is_cpu()
    }

    /// Seconds since the engine started.
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// The scheduler (read-only: stats, config).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Steps that failed in a row (0 after any success).
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Admits a request, or says why not. The sampler is kept only if it is admitted.
    pub fn add(&mut self, req: NewRequest, sampler: Sampler) -> Result<(), Rejection> {
        let id = req.id;
        let now = self.now();
        self.scheduler.add(req, now)?;
        self.runner.add_request(id, sampler);
        Ok(())
    }

    /// Ends a request whose client went away.
    pub fn abort(&mut self, id: RequestId) -> Option<Event> {
        let now = self.now();
        self.scheduler.abort(id, now)
    }

    /// Ends a request as `stop` (the server matched a stop string).
    pub fn stop(&mut self, id: RequestId) -> Option<Event> {
        let now = self.now();
        self.scheduler.finish(id, pace_scheduler::FinishReason::Stop, now)
    }

    /// True while any request is waiting or running.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    /// One step: schedule, execute, update.
    pub fn step(&mut self) -> StepReport {
        let now = self.now();
        let mut plan = std::mem::take(&mut self.plan);
        self.scheduler.schedule_into(now, &mut plan);
        let mut report = StepReport { num_tokens: plan.num_tokens(), num_seqs: plan.seqs.len(), ..Default::default() };
        let t0 = Instant::now();
        let feeds = |t: Option<u32>| t.is_some_and(|t| plan.seqs.iter().any(|s| s.tokens.contains(&t)));
        let (inject, inject_panic) = (feeds(self.fail_on_token), feeds(self.panic_on_token));
        if let Some((token, secs)) = self.stall_on_token {
            if feeds(Some(token)) {
                std::thread::sleep(std::time::Duration::from_secs_f64(secs));
            }
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            if inject {
                panic!("injected fault (--debug-fail-on-token)");
            }
            self.runner.execute(&plan)
        }));
        let exec = t0.elapsed().as_secs_f64();
        let end = self.now();
        match result {
            Ok(Ok(out)) => {
                if !plan.seqs.is_empty() {
                    let shape = StepShape::of(&plan);
                    report.exec_secs = exec;
                    report.predicted_secs = self.scheduler.cost_model().predict(&shape);
                    if let Some(w) = self.step_trace.as_mut() {
                        use std::io::Write as _;
                        let line = format!(
                            "{{\"t\":{:.6},\"seqs\":{},\"prefill_tokens\":{},\"decode_seqs\":{},\"kv_tokens\":{},\"attn_pairs\":{},\"predicted\":{:.6},\"fitted\":{:.6},\"measured\":{:.6}}}\n",
                            now,
                            plan.seqs.len(),
                            shape.prefill_tokens,
                            shape.decode_seqs,
                            shape.kv_tokens,
                            shape.attn_pairs,
                            report.predicted_secs,
                            self.scheduler.cost_model().coeffs().predict(&shape),
                            exec
                        );
                        if w.write_all(line.as_bytes()).is_err() {
                            self.step_trace = None;
                        }
                    }
                    self.scheduler.observe_step(&shape, exec);
                    self.consecutive_failures = 0;
                }
                report.broken_rows = out.failed.len();
                report.events = self.scheduler.update(&plan, &out, end);
                if inject_panic {
                    panic!("injected engine panic (--debug-panic-on-token)");
                }
            }
            Ok(Err(e)) => report.error = Some(e.to_string()),
            Err(panic) => report.error = Some(format!("panic in the model step: {}", panic_message(panic.as_ref()))),
        }
        if report.error.is_some() {
            self.consecutive_failures += 1;
            report.events = self.scheduler.fail_step(&plan, end);
        }
        self.plan = plan;
        report.length_errors.extend(self.scheduler.drain_length_errors());
        if let Some(hook) = &mut self.kv_events {
            let mut events = Vec::new();
            self.scheduler.take_kv_events(&mut events);
            if !events.is_empty() {
                hook(events);
            }
        }
        report
    }
}

/// The text of a panic's payload.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match panic.downcast_ref::<&str>() {
        Some(s) => (*s).to_string(),
        None => match panic.downcast_ref::<String>() {
            Some(s) => s.clone(),
            None => "(no message)".to_string(),
        },
    }
}
