//! Replicas behind a router: what the router reads and how fresh it is, and each replica's state
//!
//! Each replica is its own scheduler with its step in flight; [`super::run_fleet`] drives them.

use serde::{Deserialize, Serialize};

use super::SimRequest;
use crate::cost::StepShape;
use crate::scheduler::Scheduler;

/// How a fleet's router picks the replica for a request (and for each retry of one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Router {
    /// In turn.
    #[default]
    RoundRobin,
    /// The fewest requests running, waiting or on their way (the queue signal routers read
    /// today).
    LeastQueue,
    /// The shortest predicted wait before a new request would start (pace's
    /// `pace_predicted_wait_seconds`, `/get_load`'s `predicted_wait_s`), ties by the fewest
    /// requests.
    PredictedWait,
    /// The fewest tokens of work: prompt tokens still to prefill plus the tokens the running
    /// requests hold (`/get_load`'s `num_tokens`, what SGLang's `power_of_two` compares).
    LeastTokens,
}

impl Router {
    /// Every router, by its `--router` name.
    pub const ALL: [(&'static str, Router); 4] = [
        ("round-robin", Router::RoundRobin),
        ("least-queue", Router::LeastQueue),
        ("predicted-wait", Router::PredictedWait),
        ("least-tokens", Router::LeastTokens),
    ];

    /// Its `--router` name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, r)| *r == self).map_or("round-robin", |(n, _)| n)
    }

    /// A router from its name.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|(_, r)| *r).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
            format!("unknown router `{s}`: expected one of {}", names.join(", "))
        })
    }
}

/// Identical replicas behind one router.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// Replicas (1: one server, no router).
    pub replicas: usize,
    /// How requests are spread over them.
    pub router: Router,
    /// Seconds between the router's polls of the replicas' load (0: it sees them exactly at
    /// every request). Between polls it routes by what it last saw, as real routers do (SGLang's
    /// gateway polls `/get_load` every `--worker-startup-check-interval`).
    #[serde(default)]
    pub poll_s: f64,
}

impl Default for Fleet {
    fn default() -> Self {
        Self { replicas: 1, router: Router::RoundRobin, poll_s: 0.0 }
    }
}

/// A replica's load as the router sees it.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Seen {
    queue: usize,
    wait: f64,
    tokens: usize,
}

/// The router: its turn (ties go round) and, when it polls, what it saw last.
pub(super) struct RouterState {
    pub(super) fleet: Fleet,
    pub(super) turn: usize,
    pub(super) next_poll: f64,
    pub(super) seen: Vec<Seen>,
}

impl RouterState {
    /// The replica the router picks at `now`.
    pub(super) fn route(&mut self, now: f64, reps: &[Replica], reqs: &[SimRequest]) -> usize {
        let n = reps.len();
        let first = self.turn % n;
        self.turn += 1;
        let router = self.fleet.router;
        if router == Router::RoundRobin {
            return first;
        }
        if self.fleet.poll_s <= 0.0 || now >= self.next_poll || self.seen.len() != n {
            self.seen = reps.iter().map(|r| r.seen(router, reqs)).collect();
            self.next_poll = now + self.fleet.poll_s;
        }
        let seen = &self.seen;
        let order = (0..n).map(|k| (first + k) % n);
        match router {
            Router::RoundRobin => Some(first),
            Router::LeastQueue => order.min_by_key(|&r| seen[r].queue),
            Router::PredictedWait => order.min_by(|&a, &b| seen[a].wait.total_cmp(&seen[b].wait).then(seen[a].queue.cmp(&seen[b].queue))),
            Router::LeastTokens => order.min_by_key(|&r| seen[r].tokens),
        }
        .unwrap_or(first)
    }
}

/// One replica of a run: its scheduler, its step in flight and what was routed to it meanwhile.
pub(super) struct Replica {
    pub(super) sched: Scheduler,
    /// When it next acts: its step in flight ends, a client may leave, or never (idle until
    /// a request is routed to it).
    pub(super) next: f64,
    pub(super) plan: crate::plan::BatchPlan,
    /// The step in flight's shape and duration.
    pub(super) step: Option<(StepShape, f64)>,
    /// Requests routed to it since its last step began, added when the step ends, as a server
    /// adds what arrived while it computed: retries first, then new requests.
    pub(super) retries_in: Vec<(usize, f64)>,
    pub(super) arrivals_in: Vec<(usize, f64)>,
}

impl Replica {
    fn inbox(&self) -> impl Iterator<Item = usize> + '_ {
        self.retries_in.iter().chain(&self.arrivals_in).map(|&(i, _)| i)
    }

    /// Requests running, waiting or on their way.
    fn queue(&self) -> usize {
        self.sched.num_running() + self.sched.num_waiting() + self.retries_in.len() + self.arrivals_in.len()
    }

    /// Seconds until a request routed now would start.
    fn predicted_wait(&self, reqs: &[SimRequest]) -> f64 {
        self.sched.predicted_wait(self.inbox().map(|i| reqs[i].prompt_len).sum())
    }

    /// Its load as a router reads it (the tokens only for a router that reads them: they cost a
    /// walk over the running requests).
    fn seen(&self, router: Router, reqs: &[SimRequest]) -> Seen {
        let inbox_tokens: usize = self.inbox().map(|i| reqs[i].prompt_len).sum();
        let tokens = if router == Router::LeastTokens { self.sched.num_tokens() + inbox_tokens } else { 0 };
        Seen { queue: self.queue(), wait: self.predicted_wait(reqs), tokens }
    }

    /// Routes request `i` here at `at` (the run's clock is `now`): an idle replica wakes.
    pub(super) fn receive(&mut self, i: usize, at: f64, retry: bool, now: f64) {
        if retry {
            self.retries_in.push((i, at));
        } else {
            self.arrivals_in.push((i, at));
        }
        if self.step.is_none() {
            self.next = self.next.min(at.max(now));
        }
    }
}
