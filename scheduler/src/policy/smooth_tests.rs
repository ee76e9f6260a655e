//! Tests of [`super::smooth`]: its plan (due set, chunks, preemption) and its door.

use super::{Smooth, SmoothConfig};
use crate::cost::{CostCoeffs, StepCostModel};
use crate::lengths::LengthModel;
use crate::patience::PatienceModel;
use crate::policy::{Decisions, Policy, PolicyContext, SeqView};
use crate::slo::{Penalty, SloClass, SloParams};

/// The CPU preset's step costs, roughly.
fn cost() -> StepCostModel {
    StepCostModel::new(CostCoeffs { base_s: 0.007, per_prefill_token_s: 0.0017, per_decode_seq_s: 0.0018, per_kv_token_s: 5e-6, per_attn_pair_s: 1e-6 })
}

/// A request that arrived at `arrival` with `prompt` tokens, `output` of them generated (and
/// computed, so it is ready to decode when `output > 0`).
fn seq(id: u64, arrival: f64, prompt: usize, output: usize, weight: f64) -> SeqView {
    let computed = if output > 0 { prompt + output - 1 } else { 0 };
    SeqView {
        id,
        arrival,
        class: SloClass { weight, ..SloClass::default() },
        prompt_len: prompt,
        cached_prompt: 0,
        num_tokens: prompt + output,
        num_computed: computed,
        num_output: output,
        max_output: 1000,
        blocks_held: (prompt + output).div_ceil(16),
        first_token_time: None,
        last_token_time: None,
        max_lateness: 0.0,
        num_preemptions: 0,
        runs_to_max: false,
    }
}

/// Clients that never left.
static PATIENCE: std::sync::LazyLock<PatienceModel> = std::sync::LazyLock::new(PatienceModel::default);

/// A context with room to spare (1000 blocks, 256 sequences, 512 tokens a step).
fn context<'a>(
    running: &'a [SeqView],
    waiting: &'a [SeqView],
    now: f64,
    (cost, lengths, slo): (&'a StepCostModel, &'a LengthModel, &'a SloParams),
) -> PolicyContext<'a> {
    PolicyContext {
        now,
        running,
        waiting,
        free_blocks: 1000,
        total_blocks: 1000,
        block_size: 16,
        max_num_seqs: 256,
        max_batch_tokens: 512,
        cost,
        lengths,
        patience: &PATIENCE,
        recent_ends: &[],
        ends: 0,
        completed: 0,
        slo,
    }
}

fn plan(running: &[SeqView], waiting: &[SeqView], now: f64, penalty: Penalty) -> Decisions {
    let (cost, lengths) = (cost(), LengthModel::default());
    let slo = SloParams { penalty, ..SloParams::default() };
    let ctx = context(running, waiting, now, (&cost, &lengths, &slo));
    let mut d = Decisions::default();
    Smooth::new(SmoothConfig::default()).plan(&ctx, &mut d);
    d
}

/// The prefill load a stream's replacement brings is priced at what is computed: a prompt
/// the prefix cache mostly holds costs a fraction of one it does not.
#[test]
fn cached_prompt_tokens_are_not_priced_as_prefill() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let c = cost.coeffs();
    let kappa = |cached: usize| {
        let mut w = seq(1, 0.0, 1600, 0, 1.0);
        w.cached_prompt = cached;
        w.num_computed = cached;
        let waiting = [w];
        super::prefill_per_token(&c, &context(&[], &waiting, 0.0, (&cost, &lengths, &slo)), None)
    };
    let (cold, warm) = (kappa(0), kappa(1584));
    assert!(cold > 0.0 && warm > 0.0);
    assert!(warm < cold / 20.0, "cold {cold} warm {warm}");
}

/// Once two prompts are both late, the heavier (a higher priority) is prefilled first even
/// though it came later: the order that loses least is by prefill time over weight.
#[test]
fn a_heavier_request_goes_first_once_both_are_late() {
    let waiting = [seq(1, 0.0, 200, 0, 1.0), seq(2, 0.1, 200, 0, 4.0)];
    let d = plan(&[], &waiting, 1.0, Penalty::Linear);
    assert_eq!(d.grants.first().map(|g| g.id), Some(2), "{d:?}");
    // Weight is traded against length: four times the weight does not buy eight times the
    // prefill ahead of a short prompt.
    let waiting = [seq(1, 0.0, 100, 0, 1.0), seq(2, 0.1, 800, 0, 4.0)];
    assert_eq!(plan(&[], &waiting, 1.0, Penalty::Linear).grants.first().map(|g| g.id), Some(1));
}

/// A stream already late by `L` can be late by `L` again at no cost, and one past a capped
/// penalty's cap loses nothing more: neither is due before a stream about to run dry, and the
/// one past the cap is the first to give up its blocks.
#[test]
fn idle_latency_already_paid_is_slack() {
    let now = 10.0;
    // 45 tokens since 0: next deadline 9.2 s, 0.8 s ago; but it was once 2 s late.
    let mut late = seq(1, 0.0, 50, 45, 1.0);
    late.max_lateness = 2.0;
    // Next deadline 10.04 s: due in 40 ms.
    let fresh = seq(2, 0.04, 50, 49, 1.0);
    let d = plan(&[late, fresh], &[], now, Penalty::Linear);
    assert_eq!(d.grants.first().map(|g| g.id), Some(2), "{d:?}");
    // Under a 1 s cap the late stream has nothing more to lose.
    let d = plan(&[late, fresh], &[], now, Penalty::Capped(1.0));
    assert_eq!(d.grants.first().map(|g| g.id), Some(2), "{d:?}");
    assert_eq!(d.victims.first(), Some(&1), "{d:?}");
}

/// Out of blocks, the stream that loses least per block freed is preempted first: a deep
/// buffer whose recompute fits in its slack loses nothing; of two streams that would both
/// run dry, the lighter one goes before the heavier.
#[test]
fn preemption_takes_the_least_loss_per_block() {
    let now = 10.0;
    // 30 tokens ahead of its reader (deadline 16 s): recomputing 80 tokens takes far less.
    let deep = seq(1, 0.0, 50, 80, 1.0);
    // Both due within 40 ms, same size; one weighs 4.
    let light = seq(2, 0.04, 50, 49, 1.0);
    let heavy = seq(3, 0.04, 50, 49, 4.0);
    let d = plan(&[heavy, light, deep], &[], now, Penalty::Linear);
    assert_eq!(d.victims, vec![1, 2, 3], "{d:?}");
}

/// The door refuses for what waiting costs, and only where refusing frees something: on an
/// idle server a request that cannot be on time even alone (here every step takes 10 s) is
/// served; behind a long queue it is served too when nothing shows a sustained overload (a
/// burst, or a closed loop's opening: its client would send its next request into the same
/// queue), and refused under one.
#[test]
fn an_idle_server_serves_what_it_cannot_serve_on_time() {
    let cost = StepCostModel::new(CostCoeffs { base_s: 10.0, ..cost().coeffs() });
    let (lengths, slo) = (LengthModel::default(), SloParams::default());
    let queue: Vec<SeqView> = (2..22).map(|id| seq(id, 100.0, 400, 0, 1.0)).collect();
    let ctx = |waiting| context(&[], waiting, 100.0, (&cost, &lengths, &slo));
    let mut smooth = Smooth::new(SmoothConfig::default());
    assert!(smooth.admit(&seq(1, 100.0, 64, 0, 1.0), &ctx(&[])).is_ok());
    assert!(smooth.admit(&seq(1, 100.0, 64, 0, 1.0), &ctx(&queue)).is_ok());
    assert!(door_after(2.0, 1.0, &ctx(&queue)).is_err());
}

/// A batch of 80 light streams early in their answers, more than the pool holds at their
/// expected ends, and six requests queued behind it.
fn full_batch() -> (Vec<SeqView>, Vec<SeqView>) {
    let running = (0..80).map(|i| seq(i, 0.0, 40, 5 + (i as usize * 7) % 60, 1.0)).collect();
    let waiting = (100..106).map(|i| seq(i, 9.9, 40, 0, 1.0)).collect();
    (running, waiting)
}

/// A stream already late owes its lateness whether it is preempted or not. Under a 1 s cap,
/// one 1.6 s late will be past the cap anyway: preempting it costs nothing, while a stream
/// just due would become late.
#[test]
fn lateness_owed_anyway_is_not_a_preemption_loss() {
    let now = 10.0;
    // Token 42 was due at 8.4 s.
    let late = seq(1, 0.0, 50, 41, 1.0);
    // Token 50 is due at 10.04 s.
    let due = seq(2, 0.04, 50, 49, 1.0);
    let d = plan(&[due, late], &[], now, Penalty::Capped(1.0));
    assert_eq!(d.victims, vec![1, 2], "{d:?}");
}

/// The start rule holds a batch the machine cannot keep: 80 streams will hold more KV blocks at
/// their expected ends than the pool has, so nothing queued starts, although places and blocks
/// are free now; the same queue behind four streams starts at once. Without the rule (`start=0`)
/// the full batch takes them.
#[test]
fn the_start_rule_holds_what_the_readers_cannot_use() {
    let (running, waiting) = full_batch();
    let started = |running: &[SeqView], cfg: SmoothConfig| {
        let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
        let ctx = context(running, &waiting, 10.0, (&cost, &lengths, &slo));
        let mut d = Decisions::default();
        Smooth::new(cfg).plan(&ctx, &mut d);
        d.grants.iter().filter(|g| g.id >= 100).count()
    };
    assert_eq!(started(&running, SmoothConfig::default()), 0);
    // Four streams seconds ahead of their readers (no step is capped for them).
    let ahead: Vec<SeqView> = (0..4).map(|i| seq(i, 9.9, 40, 20, 1.0)).collect();
    assert_eq!(started(&ahead, SmoothConfig::default()), 6);
    // (The late streams cap the step's time, rule 3, so that is off too.)
    assert_eq!(started(&running, SmoothConfig { start: false, chunk: false, ..SmoothConfig::default() }), 6);
}

/// One start rule: the door predicts a start now exactly when the batch would start the
/// request now (here for a newcomer with nobody queued, behind batches of 0 to 120 streams).
#[test]
fn the_door_predicts_starts_by_the_batch_rule() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let c = cost.effective();
    for n in (0..=120).step_by(4) {
        let running: Vec<SeqView> = (0..n).map(|i| seq(i, 0.0, 40, 5 + (i as usize * 7) % 60, 1.0)).collect();
        let req = seq(1000, 10.0, 40, 0, 1.0);
        let waiting = [req];
        let ctx = context(&running, &waiting, 10.0, (&cost, &lengths, &slo));
        let mut d = Decisions::default();
        let mut s = Smooth::new(SmoothConfig::default());
        s.plan(&ctx, &mut d);
        let starts = d.grants.iter().any(|g| g.id == 1000);
        let ctx = context(&running, &[], 10.0, (&cost, &lengths, &slo));
        let rem = lengths.expected_total(req.max_output);
        let kappa = super::prefill_per_token(&c, &ctx, Some((&req, rem)));
        let at = s.predicted_start(&req, rem, &ctx, &c, kappa);
        assert_eq!(starts, at == 10.0, "{n} streams: plan starts {starts}, door predicts {at}");
    }
}

/// KV blocks of a prefix another request holds are not counted again: eight prompts that share
/// a cached 192-token prefix all start in a 40-block pool, where the same prompts uncached (14
/// blocks each at their ends) start two.
#[test]
fn blocks_shared_through_the_prefix_cache_count_once() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let waiting = |cached: usize| -> Vec<SeqView> {
        (0..8).map(|i| SeqView { cached_prompt: cached, num_computed: cached, max_output: 16, ..seq(i, 0.0, 200, 0, 1.0) }).collect()
    };
    let started = |waiting: &[SeqView]| {
        let mut ctx = context(&[], waiting, 0.0, (&cost, &lengths, &slo));
        (ctx.total_blocks, ctx.max_batch_tokens) = (40, 4096);
        let mut d = Decisions::default();
        Smooth::new(SmoothConfig::default()).plan(&ctx, &mut d);
        d.grants.len()
    };
    assert_eq!(started(&waiting(0)), 2);
    assert_eq!(started(&waiting(192)), 8);
}

/// The door's answer to a newcomer at `ctx`'s time after five minutes in which new requests
/// arrived at `rate` a second and others ran to their ends at `ended` a second (each 40 tokens
/// in, up to 1,000 out), in the same state.
fn door_after(rate: f64, ended: f64, ctx: &PolicyContext<'_>) -> Result<(), (crate::request::RejectReason, f64)> {
    let ends = (300.0 * ended) as u64;
    door_seeing(rate, ended, ctx).admit(&seq(1000, ctx.now, 40, 0, 1.0), &PolicyContext { ends, completed: ends, ..*ctx })
}

/// A door that has seen the five minutes of [`door_after`].
fn door_seeing(rate: f64, ended: f64, ctx: &PolicyContext<'_>) -> Smooth {
    let mut s = Smooth::new(SmoothConfig::default());
    let n = (300.0 * rate) as u64;
    for i in 0..n {
        let now = ctx.now - (n - i) as f64 / rate;
        // Ends well apart from arrivals: none is a client answering one.
        let end = [now - 0.25];
        let ends = ((now - ctx.now + 300.0) * ended) as u64;
        let c = PolicyContext { now, recent_ends: &end, ends, completed: ends, ..*ctx };
        let _ = s.admit(&seq(2000 + i, now, 40, 0, 1.0), &c);
    }
    s
}

/// The start rule does not hold a request back to keep the batch fed: 200 streams that need
/// about twice the machine's time to give every reader 5 tok/s still take a newcomer while the
/// KV pool has room. The door prices the slowdown instead: it serves the newcomer while demand
/// keeps pace with completions and refuses it under sustained overload, where the same
/// newcomer behind four streams is served.
#[test]
fn the_batch_starts_what_it_cannot_feed_and_the_door_prices_the_slowdown() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let running: Vec<SeqView> = (0..200).map(|i| seq(i, 0.0, 40, 5 + (i as usize * 7) % 60, 1.0)).collect();
    let waiting = [seq(1000, 100.0, 40, 0, 1.0)];
    fn roomy<'a>(running: &'a [SeqView], waiting: &'a [SeqView], models: (&'a StepCostModel, &'a LengthModel, &'a SloParams)) -> PolicyContext<'a> {
        PolicyContext { free_blocks: 100_000, total_blocks: 100_000, ..context(running, waiting, 100.0, models) }
    }
    let m = (&cost, &lengths, &slo);
    let ctx = roomy(&running, &waiting, m);
    let mut s = Smooth::new(SmoothConfig::default());
    let mut d = Decisions::default();
    s.plan(&ctx, &mut d);
    assert!(d.grants.iter().any(|g| g.id == 1000), "{d:?}");
    let c = cost.effective();
    let rem = lengths.expected_total(1000);
    let kappa = super::prefill_per_token(&c, &ctx, None);
    assert_eq!(s.predicted_start(&waiting[0], rem, &roomy(&running, &[], m), &c, kappa), 100.0);
    assert!(s.util.0 > 1.5, "utilization {:?}", s.util);
    let ctx = roomy(&running, &[], m);
    assert!(door_after(1.0, 1.2, &ctx).is_ok());
    assert!(door_after(2.0, 1.0, &ctx).is_err());
    assert!(door_after(2.0, 1.0, &roomy(&running[..4], &[], m)).is_ok());
}

/// A newcomer that must wait for a place is refused for what it adds to later arrivals' waits
/// only when, over the last minute, more new requests arrived than ran to their ends; the same
/// queue when arrivals keep pace with completions, or after a burst, is served. A client that
/// comes straight back after its refusal is served: refusing it again frees nothing.
#[test]
fn the_door_refuses_for_waiting_only_under_sustained_overload() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let (running, waiting) = full_batch();
    let ctx = context(&running, &waiting, 100.0, (&cost, &lengths, &slo));
    assert!(door_after(2.0, 1.0, &ctx).is_err());
    assert!(door_after(1.0, 1.2, &ctx).is_ok());
    // A burst: one arrival, the rest of the queue already there.
    assert!(Smooth::new(SmoothConfig::default()).admit(&seq(1000, 100.0, 40, 0, 1.0), &ctx).is_ok());
    // Refused, then back 20 ms later.
    let mut s = door_seeing(2.0, 1.0, &ctx);
    let refused = |s: &mut Smooth| {
        let mut d = Decisions::default();
        s.plan(&ctx, &mut d);
        d.door.unwrap().refused
    };
    let before = refused(&mut s);
    let ctx = PolicyContext { ends: 300, completed: 300, ..ctx };
    assert!(s.admit(&seq(1000, 100.0, 40, 0, 1.0), &ctx).is_err());
    assert!(s.admit(&seq(1001, 100.02, 40, 0, 1.0), &PolicyContext { now: 100.02, ..ctx }).is_ok());
    assert_eq!(refused(&mut s), before + 1);
}

/// A closed loop's clients answer the end of a request at once: their arrivals are not new
/// demand (the door never judges a closed loop overloaded, however many answer), and one that
/// answers a refusal is not refused again (refusing frees nothing), so a run of newcomers that
/// would be worth less than nothing queued is not refused: its refusal would only send the
/// client's next request into the same queue.
#[test]
fn clients_answering_ends_are_not_new_demand_nor_refused() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let (running, _) = full_batch();
    // A queue of 200 prompts: a newcomer behind it is worth nothing.
    let long: Vec<SeqView> = (300..500).map(|i| seq(i, 0.0, 400, 0, 1.0)).collect();
    let mut s = Smooth::new(SmoothConfig::default());
    let mut ends = 0;
    for i in 0..400_u32 {
        // Something finished; a client answers it 5 ms later.
        let t = 50.0 + f64::from(i) * 0.2;
        ends += 1;
        let mut ctx = context(&running, &long, t, (&cost, &lengths, &slo));
        let first = [t - 0.005];
        (ctx.recent_ends, ctx.ends) = (&first, ends);
        assert!(s.admit(&seq(1000 + u64::from(i), t, 40, 0, 1.0), &ctx).is_ok(), "newcomer {i}");
    }
    let mut d = Decisions::default();
    let ctx = context(&running, &long, 200.0, (&cost, &lengths, &slo));
    s.plan(&ctx, &mut d);
    let door = d.door.unwrap();
    assert_eq!((door.refused, door.returns, door.overloaded_arrivals), (0, 400, 0), "{door:?}");
}

/// Sustained overload is seen about one answer's reading time after it starts, not after a
/// full window: arrivals at twice the rate of completions from the first second are judged an
/// overload soon after the first requests fall due (their expected answers read at 5 tok/s),
/// well before the 60 s window is full; arrivals at the rate of completions never are, and
/// neither is a burst of 30 at once that the batch serves on time.
#[test]
fn the_door_sees_an_overload_once_requests_fall_due() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let req = |id: u64, at: f64| SeqView { max_output: 200, ..seq(id, at, 40, 0, 1.0) };
    // Seconds to read an expected answer.
    let read = lengths.expected_total(200) / 5.0;
    assert!((20.0..40.0).contains(&read), "{read}");
    // When the door first judges an overload, with arrivals every `gap` seconds after a burst
    // of `burst`, and `done(t)` requests completed by time t.
    let first_verdict = |burst: u64, gap: f64, done: &dyn Fn(f64) -> f64| -> Option<f64> {
        let mut s = Smooth::new(SmoothConfig::default());
        let (running, waiting) = full_batch();
        let (mut i, mut t) = (0, 0.0);
        while t < 90.0 {
            let completed = done(t) as u64;
            // Ends well apart from arrivals: none is a client answering one.
            let end = [t - 0.25];
            let ctx = PolicyContext { recent_ends: &end, ends: completed, completed, ..context(&running, &waiting, t, (&cost, &lengths, &slo)) };
            let _ = s.admit(&req(i, t), &ctx);
            if s.stats.overloaded {
                return Some(t);
            }
            i += 1;
            if i >= burst {
                t += gap;
            }
        }
        None
    };
    // Twice as many arrivals as completions, which start once the first answers are read.
    let over = first_verdict(1, 0.5, &|t| (t - read).max(0.0));
    assert!(over.is_some_and(|t| t > read && t < read + 15.0), "overload first seen at {over:?}, answers read in {read} s");
    // Completions keep pace (each request ends a little before it is due).
    assert_eq!(first_verdict(1, 1.0, &|t| (t - read + 3.0).max(0.0)), None);
    // A burst of 30 the batch serves on time (answered over the 6 s before they fall due), then
    // arrivals at the machine's pace, each a little later than it would have been without it.
    assert_eq!(first_verdict(30, 1.0, &|t| ((t - read + 6.0) * 5.0).clamp(0.0, 30.0) + (t - read - 2.0).max(0.0)), None);
    // The same burst answered late, over 15 s after it fell due, is an overload while the lag
    // lasts: the machine is behind its readers.
    assert!(first_verdict(30, 1.0, &|t| ((t - read) * 2.0).clamp(0.0, 30.0) + (t - read - 15.0).max(0.0)).is_some());
}

/// Independent arrivals land within 0.1 s of some end by chance (at 3 ends a second, about two
/// in five): the door measures that chance before each arrival and counts new demand up by it,
/// so an open loop's demand is seen whole, while a closed loop's answers still count nothing.
#[test]
fn new_demand_is_not_hidden_among_chance_ends() {
    // A small deterministic generator of exponential gaps.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut gap = |rate: f64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        -((state >> 11) as f64 / (1u64 << 53) as f64).max(1e-12).ln() / rate
    };
    // 3 arrivals a second, 3 unrelated ends a second, for two minutes.
    let (mut arrivals, mut ends) = (vec![], vec![]);
    let (mut a, mut e) = (0.0, 0.0);
    while a < 120.0 {
        a += gap(3.0);
        arrivals.push(a);
    }
    while e < 121.0 {
        e += gap(3.0);
        ends.push(e);
    }
    let counted = |arrivals: &[f64], ends: &[f64]| -> (f64, usize) {
        let mut d = super::Demand::default();
        let mut follows = 0;
        for &at in arrivals {
            let known: Vec<f64> = ends.iter().copied().filter(|&t| t <= at + 0.05).collect();
            let (f, _) = d.arrival((at, at + 30.0), 60.0, (&known, known.len() as u64), 0);
            follows += usize::from(f);
        }
        (d.asked.sum, follows)
    };
    let (asked, follows) = counted(&arrivals, &ends);
    let truth = arrivals.iter().filter(|&&t| t >= 110.0).count() as f64;
    assert!(follows as f64 > 0.25 * arrivals.len() as f64, "{follows} of {} taken for answers", arrivals.len());
    assert!((asked - truth).abs() < 0.25 * truth, "new demand over the last 10 s counted {asked:.1}, {truth} arrived");
    // A closed loop: every arrival answers an end 5 ms before it.
    let answers: Vec<f64> = arrivals.iter().map(|t| t - 0.005).collect();
    let (asked, follows) = counted(&arrivals, &answers);
    assert_eq!(follows, arrivals.len());
    assert_eq!(asked, 0.0);
}

/// A request no stop token can end (`ignore_eos`, no stop ids: what benchmark clients send)
/// produces `max_tokens`: that, not the learned lengths, is what it is expected to produce.
#[test]
fn a_request_no_stop_token_can_end_is_expected_to_run_to_max_tokens() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let ctx = context(&[], &[], 0.0, (&cost, &lengths, &slo));
    let forced = SeqView { max_output: 128, runs_to_max: true, ..seq(1, 0.0, 40, 0, 1.0) };
    assert_eq!(ctx.expected_remaining(&forced), 128.0);
    assert_eq!(ctx.expected_remaining(&SeqView { num_output: 100, ..forced }), 28.0);
    // The prior (a mean of 256) expects fewer from one that may stop.
    let free = SeqView { runs_to_max: false, ..forced };
    assert!(ctx.expected_remaining(&free) < 110.0, "{}", ctx.expected_remaining(&free));
}
