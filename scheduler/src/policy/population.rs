//! Is the client population closed? Smooth's door asks ([`Loop`]); its one user is
//! [`super::smooth`].

/// Is the client population closed? Refusing a request under overload helps only if the demand
/// goes away with it: then the queue it would have joined stays short for the requests that come
/// later. A closed population of clients (each sends its next request as soon as the last one
/// ends or is refused) just sends again: a refusal scores 0 and frees nothing, and queueing does
/// not lengthen the queue either (a client waits in it instead of elsewhere). This watches the
/// first arrival after each end of a request (finished, left, or refused): one that comes within
/// `min(20 ms, 0.05 / rate)` of it (`rate` the arrival rate over the last 32 arrivals) is a client
/// that answered the end (independent arrivals land that close with a probability under 5%).
/// While most ends are answered so (an average over the last eight or so), the population is
/// taken to be closed. Arrival times are the requests' own (stamped when they reached the server),
/// so a server busy with a step when the retry comes still sees how soon it came.
#[derive(Debug, Clone, Default)]
pub(super) struct Loop {
    /// Ends already matched with an arrival (a count: several can end at one instant).
    matched: u64,
    /// The latest arrivals, oldest first.
    recent: std::collections::VecDeque<f64>,
    /// Moving average of "the end was answered at once".
    score: f64,
}

impl Loop {
    const WINDOW_S: f64 = 0.02;
    const WEIGHT: f64 = 0.125;
    const RATE_SAMPLES: usize = 32;

    /// A request that arrived at `at`, the latest end having been at `last_end`; returns whether
    /// the population looks closed.
    pub(super) fn arrival(&mut self, at: f64, last_end: f64, ends: u64) -> bool {
        if self.recent.len() >= Self::RATE_SAMPLES {
            self.recent.pop_front();
        }
        self.recent.push_back(at);
        let span = self.recent.back().copied().unwrap_or(at) - self.recent.front().copied().unwrap_or(at);
        let window = if span > 0.0 { Self::WINDOW_S.min(0.05 * span / (self.recent.len() - 1) as f64) } else { Self::WINDOW_S };
        // The first arrival after an end (not before it: a request that was on its way when
        // something ended did not answer that end).
        if ends > self.matched && last_end <= at {
            self.matched = ends;
            let answered = at - last_end <= window;
            self.score += Self::WEIGHT * (f64::from(u8::from(answered)) - self.score);
        }
        self.score > 0.5
    }
}

/// Closed-loop detection.
#[cfg(test)]
mod tests {
    use super::Loop;

    /// Clients that answer an end at once are told apart from independent arrivals that happen
    /// to follow one.
    #[test]
    fn a_closed_loop_is_told_from_independent_arrivals() {
        // Independent arrivals every 100 ms, something ending 30 ms before each: far outside
        // 5% of the gap.
        let mut open = Loop::default();
        for i in 0..200_u32 {
            let t = f64::from(i) * 0.1;
            assert!(!open.arrival(t, t - 0.03, u64::from(i) + 1), "arrival {i}");
        }
        // A closed loop: each end is answered at once (the same instant in the simulator, a few
        // milliseconds on a server), and several clients may answer the same end (a step that
        // finished several streams); a request on its way before the end is not an answer.
        let mut closed = Loop::default();
        let mut seen = vec![];
        for i in 0..40_u32 {
            let end = f64::from(i) * 0.5;
            let n = u64::from(i) * 2 + 2;
            seen.push(closed.arrival(end - 0.2, end, n));
            seen.push(closed.arrival(end + 0.003, end, n));
            seen.push(closed.arrival(end + 0.004, end, n));
        }
        // A storm of refusals at one instant: each is an end, answered at once.
        let mut storm = Loop::default();
        let answered: Vec<bool> = (1..=20).map(|n| storm.arrival(1.0, 1.0, n)).collect();
        assert!(answered[19], "{answered:?}");
        assert!(!seen[0] && seen[119], "{seen:?}");
        // Once ends are no longer answered, the population is open again.
        let mut t = 20.0;
        for n in 0..40 {
            t += 0.5;
            closed.arrival(t, t - 0.25, 100 + n);
        }
        assert!(!closed.arrival(t + 0.5, t + 0.2, 200));
    }
}
