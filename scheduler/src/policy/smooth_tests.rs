//! Tests of [`super::smooth`]: its plan (due set, chunks, preemption) and its door.

use super::{Smooth, SmoothConfig};
use crate::cost::{CostCoeffs, StepCostModel};
use crate::lengths::LengthModel;
use crate::patience::PatienceModel;
use crate::policy::{Borrowing, Decisions, Policy, PolicyContext, SeqView};
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
    }
}

/// A context with room to spare (1000 blocks, 256 sequences, 512 tokens a step).
fn context<'a>(
    running: &'a [SeqView],
    waiting: &'a [SeqView],
    now: f64,
    (cost, lengths, patience, slo): (&'a StepCostModel, &'a LengthModel, &'a PatienceModel, &'a SloParams),
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
        patience,
        last_end: f64::NEG_INFINITY,
        ends: 0,
        slo,
    }
}

fn plan(running: &[SeqView], waiting: &[SeqView], now: f64, penalty: Penalty) -> Decisions {
    let (cost, lengths, patience) = (cost(), LengthModel::default(), PatienceModel::default());
    let slo = SloParams { penalty, ..SloParams::default() };
    let ctx = context(running, waiting, now, (&cost, &lengths, &patience, &slo));
    let mut d = Decisions::default();
    Smooth::new(SmoothConfig::default()).plan(&ctx, &mut d);
    d
}

/// The feed limit's feedback ([`super::FeedControl`]): streams that get their tokens slower
/// than their readers read shrink the limit while anyone waits; streams that get them faster
/// grow it only while the limit is what keeps requests out (queued or refused at the door);
/// with nobody waiting, or without `feed_target` (the default), it stays where the cost
/// model puts it.
#[test]
fn the_feed_limit_follows_what_the_streams_got() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    // Drives `plan` every 0.1 s for 60 s while `n` streams get a token every `every` plans
    // (q = 5 tok/s is one every two), with `waiting` requests queued and, if `knock`, a
    // newcomer at the door before each plan; returns the feed limit's share before and after.
    let run = |cfg: SmoothConfig, n: u64, every: usize, waiting: usize, knock: bool| -> (f64, f64) {
        let mut s = Smooth::new(cfg);
        let wait: Vec<SeqView> = (0..waiting as u64).map(|i| seq(1000 + i, 0.0, 40, 0, 1.0)).collect();
        let mut running: Vec<SeqView> = (0..n).map(|i| seq(i, 0.0, 40, 1, 1.0)).collect();
        let before = s.feed_cap(&context(&running, &wait, 0.0, (&cost, &lengths, &patience, &slo)));
        for k in 1..=600 {
            if k % every == 0 {
                for v in &mut running {
                    v.num_output += 1;
                    v.num_tokens += 1;
                    v.num_computed += 1;
                }
            }
            let ctx = context(&running, &wait, k as f64 * 0.1, (&cost, &lengths, &patience, &slo));
            if knock {
                let newcomer = SeqView { arrival: ctx.now, ..seq(5000 + k as u64, ctx.now, 40, 0, 1.0) };
                assert!(s.admit(&newcomer, &ctx).is_err(), "the door refuses while the limit binds");
            }
            s.plan(&ctx, &mut Decisions::default());
        }
        (before, s.feed_cap(&context(&running, &wait, 60.0, (&cost, &lengths, &patience, &slo))))
    };
    let on = SmoothConfig { feed_target: 1.05, ..SmoothConfig::default() };
    // 150 streams are more than the cost model lets run at 5 tok/s, even at 1.5 times its
    // share: the limit binds throughout.
    let (b, a) = run(on, 150, 1, 8, false);
    assert!(a > 1.3 * b, "fed twice as fast as read, with the limit holding requests out: {b} -> {a}");
    // Under overload the door keeps the queue empty: its refusals are the limit binding.
    let (b, a) = run(on, 150, 1, 0, true);
    assert!(a > 1.3 * b, "fed twice as fast as read, the limit refusing at the door: {b} -> {a}");
    let (b, a) = run(on, 100, 4, 8, false);
    assert!(a < 0.6 * b, "fed at half the reading rate with requests waiting: {b} -> {a}");
    let (b, a) = run(on, 100, 4, 0, false);
    assert_eq!(a, b, "nobody waits: the limit decides nothing and is left alone");
    let (b, a) = run(on, 10, 1, 8, false);
    assert_eq!(a, b, "fast streams while the limit is not what holds anyone: no wind-up");
    let off = SmoothConfig::default();
    let (b, a) = run(off, 100, 4, 8, false);
    assert_eq!(a, b, "off by default: the limit is the cost model's alone");
}

/// The experimental `end_by_benefit`: under a capped penalty, a stream past the cap whose
/// next tokens cost more machine time than a waiting request's would is ended; never a
/// stream inside the cap, never without a waiting request, never under another penalty,
/// never with the key off.
#[test]
fn end_by_benefit_ends_only_costly_streams_past_the_cap() {
    let mut long = seq(1, 0.0, 2000, 100, 1.0);
    long.max_lateness = 30.0;
    let fresh_ctx_past_cap = {
        let mut v = seq(2, 0.0, 2000, 100, 1.0);
        v.max_lateness = 1.0;
        v
    };
    let waiting = [seq(3, 50.0, 40, 0, 1.0)];
    let running = [long, fresh_ctx_past_cap];
    let decide = |on: bool, penalty: Penalty, waiting: &[SeqView]| {
        let (cost, lengths, patience) = (cost(), LengthModel::default(), PatienceModel::default());
        let slo = SloParams { penalty, ..SloParams::default() };
        let ctx = context(&running, waiting, 60.0, (&cost, &lengths, &patience, &slo));
        let mut d = Decisions::default();
        Smooth::new(SmoothConfig { end_by_benefit: on, ..SmoothConfig::default() }).plan(&ctx, &mut d);
        d.drop
    };
    assert_eq!(decide(true, Penalty::Capped(5.0), &waiting), vec![1]);
    assert!(decide(false, Penalty::Capped(5.0), &waiting).is_empty());
    assert!(decide(true, Penalty::Linear, &waiting).is_empty());
    assert!(decide(true, Penalty::Capped(5.0), &[]).is_empty());
}

/// A heavy newcomer behind a batch full of light streams is predicted to start when the
/// first of them is likely to end, not at the soonest expected end; a newcomer as light as
/// the batch keeps the sorted estimate, and so does everyone without the race.
#[test]
fn a_heavy_newcomer_predicts_its_start_by_the_race_of_lighter_streams() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let running: Vec<SeqView> = (0..80).map(|i| seq(i, 0.0, 40, 5 + (i as usize * 7) % 60, 1.0)).collect();
    let ctx = context(&running, &[], 10.0, (&cost, &lengths, &patience, &slo));
    let c = cost.effective();
    let start = |race: bool, race_all: bool, weight: f64| {
        let mut s = Smooth::new(SmoothConfig { race, race_all, ..SmoothConfig::default() });
        s.predicted_start(&seq(1000, 10.0, 40, 0, weight), &ctx, &c).0
    };
    let (sorted, raced) = (start(false, false, 4.0), start(true, false, 4.0));
    assert!(sorted > 10.0, "the batch is full: {sorted}");
    assert!(raced < sorted - 0.5 && raced > 10.0, "raced {raced}, sorted {sorted}");
    assert_eq!(start(true, false, 1.0), start(false, false, 1.0));
    // `race_all` (experimental): the light newcomer races too.
    assert_eq!(start(true, true, 1.0), raced);
}

/// Under a capped penalty the step-time limit is lifted (lateness past the cap is free, so
/// fuller batches pay) and memory still binds; every other penalty keeps both.
#[test]
fn a_capped_penalty_lifts_the_step_time_limit_but_not_memory() {
    let (cost, lengths, patience) = (cost(), LengthModel::default(), PatienceModel::default());
    for (penalty, step_limited) in [(Penalty::Linear, true), (Penalty::Quadratic, true), (Penalty::Capped(5.0), false)] {
        let slo = SloParams { penalty, ..SloParams::default() };
        let ctx = context(&[], &[], 0.0, (&cost, &lengths, &patience, &slo));
        let s = Smooth::new(SmoothConfig::default());
        assert_eq!(s.feed_cap(&ctx).is_finite(), step_limited, "{penalty:?}");
        assert_eq!(s.kv_cap(&ctx), 999.0);
    }
}

/// The prefill load a stream's replacement brings is priced at what is computed: a prompt
/// the prefix cache mostly holds costs a fraction of one it does not.
#[test]
fn cached_prompt_tokens_are_not_priced_as_prefill() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let c = cost.coeffs();
    let kappa = |cached: usize| {
        let mut w = seq(1, 0.0, 1600, 0, 1.0);
        w.cached_prompt = cached;
        w.num_computed = cached;
        let waiting = [w];
        super::prefill_per_token(&c, &context(&[], &waiting, 0.0, (&cost, &lengths, &patience, &slo)), None)
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

/// The door refuses for what waiting costs: on an idle server a request that cannot be on
/// time even alone (here every step takes 10 s) is served, and the same request behind a
/// long queue is refused.
#[test]
fn an_idle_server_serves_what_it_cannot_serve_on_time() {
    let cost = StepCostModel::new(CostCoeffs { base_s: 10.0, ..cost().coeffs() });
    let (lengths, patience, slo) = (LengthModel::default(), PatienceModel::default(), SloParams::default());
    let mut req = seq(1, 0.0, 64, 0, 1.0);
    req.max_output = 12;
    let queue: Vec<SeqView> = (2..22).map(|id| seq(id, 0.0, 400, 0, 1.0)).collect();
    let ctx = |waiting| context(&[], waiting, 0.0, (&cost, &lengths, &patience, &slo));
    let mut smooth = Smooth::new(SmoothConfig::default());
    assert!(smooth.admit(&req, &ctx(&[])).is_ok());
    assert!(smooth.admit(&req, &ctx(&queue)).is_err());
}

/// A batch of 80 light streams early in their answers, more than the feed limit keeps at 5
/// tok/s, and six requests queued behind it.
fn full_batch() -> (Vec<SeqView>, Vec<SeqView>) {
    let running = (0..80).map(|i| seq(i, 0.0, 40, 5 + (i as usize * 7) % 60, 1.0)).collect();
    let waiting = (100..106).map(|i| seq(i, 9.9, 40, 0, 1.0)).collect();
    (running, waiting)
}

/// `streams` running streams a second or two from their ends (5 tokens out, 5 to 9 to go): a full
/// batch of them frees a place within about a second.
fn near_end_batch(streams: u64) -> Vec<SeqView> {
    (0..streams).map(|i| SeqView { max_output: 10 + i as usize % 5, ..seq(i, 0.0, 40, 5, 1.0) }).collect()
}

/// The door's answer to a newcomer at `ctx`'s time after 400 arrivals at `rate` a second that
/// it saw (and answered) in the same state.
fn door_after(cfg: SmoothConfig, rate: f64, ctx: &PolicyContext<'_>) -> Result<(), (crate::request::RejectReason, f64)> {
    let mut s = Smooth::new(cfg);
    for i in 0..400 {
        let _ = s.admit(&seq(2000 + i, ctx.now - (400 - i) as f64 / rate, 40, 0, 1.0), ctx);
    }
    s.admit(&seq(1000, ctx.now, 40, 0, 1.0), ctx)
}

/// Under overload a heavy newcomer displaces a light request, not one of its own weight: with
/// a batch full of light streams, the heavy one is admitted where the plain door (`displace`
/// off) refuses it for the same predicted wait, and a light newcomer is refused either way.
#[test]
fn a_heavy_newcomer_is_weighed_against_the_light_request_it_displaces() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let (running, waiting) = full_batch();
    let ctx = context(&running, &waiting, 10.0, (&cost, &lengths, &patience, &slo));
    let admit = |displace: bool, weight: f64| {
        let mut s = Smooth::new(SmoothConfig { displace, race: false, ..SmoothConfig::default() });
        s.admit(&seq(1000, 10.0, 40, 0, weight), &ctx)
    };
    assert!(admit(false, 4.0).is_err(), "the plain door refuses the heavy newcomer here");
    assert!(admit(true, 4.0).is_ok());
    assert!(admit(true, 1.0).is_err() && admit(false, 1.0).is_err());
}

/// The experimental `door_patience` prices the newcomer's own risk of leaving before its
/// first token: with clients seen to stay, its door is the plain one; with clients seen to
/// leave within a fraction of a second, it refuses where the plain door admits (a wait the
/// margin allows but the client will not sit out), and never admits what the plain door
/// refuses.
#[test]
fn the_door_can_price_the_newcomers_own_patience() {
    let (cost, lengths, slo) = (cost(), LengthModel::default(), SloParams::default());
    let (mut stay, mut leave) = (PatienceModel::default(), PatienceModel::default());
    for i in 0..200 {
        stay.stayed(10.0 + i as f64 * 0.1);
        leave.left(0.02 + i as f64 * 0.001);
    }
    stay.refresh();
    leave.refresh();
    let decide = |patience: &PatienceModel, door_patience: bool, streams: u64| {
        let running = near_end_batch(streams);
        let ctx = context(&running, &[], 10.0, (&cost, &lengths, patience, &slo));
        Smooth::new(SmoothConfig { door_patience, ..SmoothConfig::default() }).admit(&seq(1000, 10.0, 40, 0, 1.0), &ctx).is_ok()
    };
    let mut stricter = 0;
    for streams in (0..400).step_by(8) {
        let plain = decide(&stay, false, streams);
        assert_eq!(decide(&stay, true, streams), plain, "{streams} streams, clients who stay");
        let priced = decide(&leave, true, streams);
        assert!(plain || !priced, "{streams} streams: admitted only with patience priced");
        stricter += usize::from(plain && !priced);
    }
    assert!(stricter > 0, "impatient clients make the door stricter somewhere");
}

/// The queueing margin is for sustained overload ([`SmoothConfig::sustained`]): with the
/// batch full and a queue waiting, a newcomer is refused after arrivals that offered more
/// work than the machine serves, and served after arrivals that offered little (a burst,
/// which clears by itself).
#[test]
fn the_door_refuses_for_waiting_only_under_sustained_overload() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let (running, waiting) = full_batch();
    let ctx = context(&running, &waiting, 10.0, (&cost, &lengths, &patience, &slo));
    let after = |rate: f64, sustained: bool| door_after(SmoothConfig { sustained, ..SmoothConfig::default() }, rate, &ctx);
    assert!(after(5.0, true).is_err(), "overloaded for the last 80 s");
    assert!(after(0.2, true).is_ok(), "a burst after a light load");
    assert!(after(0.2, false).is_err(), "without the test, the margin refuses either way");
}

/// The experimental `externality` door ([`SmoothConfig::externality`]) prices the lateness a
/// waiting newcomer adds to those arriving after it: with the batch full and a queue waiting,
/// it is served after arrivals that offered a third of what the machine serves (few arrive before
/// the backlog clears), refused after arrivals that offered more than it serves (everyone after
/// it would wait longer), and the refusal's Retry-After is its predicted wait for a place.
#[test]
fn the_door_can_price_the_lateness_a_newcomer_adds_to_later_arrivals() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    // A full batch whose streams end one by one, 0.6 s apart, and six requests queued.
    let running: Vec<SeqView> = (0..80).map(|i| SeqView { max_output: 20 + i as usize * 3, ..seq(i, 0.0, 40, 5, 1.0) }).collect();
    let (_, waiting) = full_batch();
    let ctx = context(&running, &waiting, 10.0, (&cost, &lengths, &patience, &slo));
    // On the sorted-ends door it was built on (the race's optimism alone admits here).
    let door = SmoothConfig { race_all: false, ..SmoothConfig::default() };
    let after = |rate: f64| door_after(SmoothConfig { externality: true, ..door }, rate, &ctx);
    // Arrivals a second that offer the machine's whole time in decode slots alone (their KV
    // reads and prefill come on top: about 1.6 times that).
    let full = 1.0 / (cost.coeffs().per_decode_seq_s * lengths.expected_total(1000));
    assert!(after(0.2 * full).is_ok(), "a third of the machine's work offered");
    let Err((_, retry)) = after(full) else { panic!("1.6 times the machine's work offered") };
    assert!(retry > 0.0 && retry < 60.0, "{retry}");
    // The plain door refuses here either way: it prices the newcomer's own wait, not the load.
    assert!(Smooth::new(door).admit(&seq(1000, 10.0, 40, 0, 1.0), &ctx).is_err());
}

/// While the feed limit holds the queue back, the place a finishing stream frees goes to the
/// heaviest waiting request, though a light one with a shorter prompt comes first in the
/// prefill order; with room for both, the prefill order (prefill time over weight) stands.
#[test]
fn a_full_batch_starts_the_heaviest_waiting_first() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let waiting = [seq(1, 0.0, 10, 0, 1.0), seq(2, 0.5, 400, 0, 4.0)];
    let first = |displace: bool, max_num_seqs: usize| {
        let mut ctx = context(&[], &waiting, 1.0, (&cost, &lengths, &patience, &slo));
        ctx.max_num_seqs = max_num_seqs;
        let mut d = Decisions::default();
        Smooth::new(SmoothConfig { displace, ..SmoothConfig::default() }).plan(&ctx, &mut d);
        d.grants.iter().map(|g| g.id).collect::<Vec<_>>()
    };
    assert_eq!(first(true, 1), vec![2]);
    assert_eq!(first(false, 1), vec![1]);
    assert_eq!(first(true, 2), first(false, 2));
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

/// The experimental `calibrate` scales the door's predicted wait for the feed limit by how long
/// admitted requests really waited: after starts that came eight times later than predicted it
/// refuses where the plain door admits (and never admits what the plain door refuses); after
/// starts that came as predicted it is the plain door.
#[test]
fn the_door_can_learn_how_far_its_start_predictions_run_short() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let trained = |ratio: f64| {
        let mut s = Smooth::new(SmoothConfig { calibrate: true, ..SmoothConfig::default() });
        let mut t = 0.0;
        for id in 5000..5050 {
            s.calibration.admitted(id, t, 1.0);
            let queued = [seq(id, t, 40, 0, 1.0)];
            // Queued at its admission and at the plan that starts it, gone from the queue after.
            for (at, waiting) in [(t, &queued[..]), (t + ratio, &queued[..]), (t + ratio + 0.01, &[][..])] {
                s.plan(&context(&[], waiting, at, (&cost, &lengths, &patience, &slo)), &mut Decisions::default());
            }
            t += ratio + 1.0;
        }
        s
    };
    let (exact, slow) = (trained(1.0), trained(8.0));
    let decide = |s: &Smooth, streams: u64| {
        let running = near_end_batch(streams);
        let ctx = context(&running, &[], 10.0, (&cost, &lengths, &patience, &slo));
        s.clone().admit(&seq(1000, 10.0, 40, 0, 1.0), &ctx).is_ok()
    };
    let plain = Smooth::new(SmoothConfig::default());
    let mut stricter = 0;
    for streams in (0..400).step_by(8) {
        let admitted = decide(&plain, streams);
        assert_eq!(decide(&exact, streams), admitted, "{streams} streams, starts as predicted");
        let calibrated = decide(&slow, streams);
        assert!(admitted || !calibrated, "{streams} streams: admitted only once calibrated");
        stricter += usize::from(admitted && !calibrated);
    }
    assert!(stricter > 0, "starts that came late make the door stricter somewhere");
}

/// fcfs-admission's door is smooth's, learning from the starts that follow its predictions as
/// smooth's does: fed the same arrivals and queues, both end with the same wait scale and the
/// same errors, and the door predicted waits and learned they run long (the test can fail).
#[test]
fn fcfs_admission_calibrates_its_door_as_smooth_does() {
    const STREAMS: u64 = 104;
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    // Streams a second or two from their ends, more than the feed limit keeps: a newcomer waits.
    let running = near_end_batch(STREAMS);
    let train = |p: &mut dyn Policy| {
        let mut t = 10.0;
        let mut errors = vec![];
        for id in 5000..5040 {
            // Once it has learned, the door refuses some: those are never queued nor followed.
            let _ = p.admit(&seq(id, t, 40, 0, 1.0), &context(&running, &[], t, (&cost, &lengths, &patience, &slo)));
            // Queued until the plan 30 s later starts it.
            let queued = [seq(id, t, 40, 0, 1.0)];
            for (at, waiting) in [(t, &queued[..]), (t + 30.0, &queued[..]), (t + 30.01, &[][..])] {
                p.plan(&context(&running, waiting, at, (&cost, &lengths, &patience, &slo)), &mut Decisions::default());
            }
            t += 31.0;
        }
        p.drain_wait_errors(&mut errors);
        (p.wait_scale(), errors)
    };
    let (scale, errors) = train(&mut Smooth::new(SmoothConfig::default()));
    assert!(scale.is_some_and(|s| s > 1.0) && errors.len() >= 20 && errors.iter().all(|&e| e < 1.0), "{scale:?} {errors:?}");
    assert_eq!(train(&mut crate::policy::FcfsAdmission::new()), (scale, errors));
    let (off, none) = train(&mut Smooth::new(SmoothConfig { calibrate: false, ..SmoothConfig::default() }));
    assert!(off.is_none() && none.is_empty());
}

/// The experimental `queue_places` ([`SmoothConfig::queue_places`]) caps the door's queueing
/// margin at the wait for that many places to free: with a batch of streams that finish within
/// a second or two (places free fast), a newcomer the plain door admits into a short wait is
/// refused somewhere, and nothing the plain door refuses is admitted.
#[test]
fn the_door_can_hold_the_queue_to_the_places_that_free() {
    let (cost, lengths, patience, slo) = (cost(), LengthModel::default(), PatienceModel::default(), SloParams::default());
    let decide = |cfg: SmoothConfig, streams: u64| {
        let running = near_end_batch(streams);
        let ctx = context(&running, &[], 10.0, (&cost, &lengths, &patience, &slo));
        Smooth::new(cfg).admit(&seq(1000, 10.0, 40, 0, 1.0), &ctx).is_ok()
    };
    let mut stricter = 0;
    for streams in (0..400).step_by(8) {
        let plain = decide(SmoothConfig::default(), streams);
        let capped = decide(SmoothConfig { queue_places: 1.0, ..SmoothConfig::default() }, streams);
        assert!(plain || !capped, "{streams} streams: admitted only with the cap");
        stricter += usize::from(plain && !capped);
        // A cap far above what the margin allows changes nothing.
        assert_eq!(decide(SmoothConfig { queue_places: 1e6, ..SmoothConfig::default() }, streams), plain, "{streams}");
    }
    assert!(stricter > 0, "places that free fast make the door stricter somewhere");
}

/// `borrow` ([`SmoothConfig::borrow`], on by default): with the batch past the feed limit,
/// the head of the queue starts while the running streams' buffers cover the overload until
/// enough of them end, and waits when the buffers are shallow, or with the key off. The door
/// predicts the same: a newcomer the plain door refuses for its predicted wait is admitted
/// while the buffers cover it, and refused when they do not. Under sustained overload neither
/// borrows.
#[test]
fn a_queued_request_can_borrow_from_deep_buffers() {
    // 85 streams 30 to 59 tokens into answers of up to 2000 (just more than the feed limit
    // keeps at 5 tok/s): at 2 s every reader is at least 4 s behind its stream; at 7 s most
    // readers are within the plan's horizon (three full steps) of theirs.
    let running: Vec<SeqView> = (0..85).map(|i| SeqView { max_output: 2000, ..seq(i, 0.0, 40, 30 + i as usize % 30, 1.0) }).collect();
    let waiting = [seq(1000, 1.0, 40, 0, 1.0)];
    let lengths = LengthModel::default();
    let (cost, patience, slo) = (cost(), PatienceModel::default(), SloParams::default());
    let ctx = |waiting, now| PolicyContext { total_blocks: 100_000, free_blocks: 100_000, ..context(&running, waiting, now, (&cost, &lengths, &patience, &slo)) };
    // Whether the head of the queue starts, and what the policy then reports of its borrowing
    // (the door's last verdict on overload, starts on the buffers so far).
    let plan = |borrow: bool, now: f64| {
        let mut d = Decisions::default();
        let mut s = Smooth::new(SmoothConfig { borrow, ..SmoothConfig::default() });
        s.plan(&ctx(&waiting, now), &mut d);
        (d.grants.iter().any(|g| g.id == 1000), s.borrowing())
    };
    let starts = |borrow: bool, now: f64| plan(borrow, now).0;
    let lent = |starts| Some(Borrowing { starts, ..Borrowing::default() });
    assert_eq!(plan(true, 2.0).1, lent(1), "one start on the buffers, counted");
    assert_eq!(plan(true, 7.0).1, lent(0), "none on shallow buffers");
    assert_eq!(plan(false, 2.0).1, None, "the key off: nothing to report");
    let door = |borrow: bool, now: f64| Smooth::new(SmoothConfig { borrow, ..SmoothConfig::default() }).admit(&seq(2000, now, 40, 0, 1.0), &ctx(&[], now)).is_ok();
    assert!(!starts(false, 2.0), "the feed limit holds it out");
    assert!(starts(true, 2.0), "deep buffers cover it");
    assert!(!starts(true, 7.0), "shallow buffers do not");
    assert!(!door(false, 2.0), "the plain door refuses the predicted wait");
    assert!(door(true, 2.0), "deep buffers: no wait");
    assert!(!door(true, 7.0), "shallow buffers: the wait again");
    // Under sustained overload (the door saw 400 arrivals at 50 a second) it borrows nothing.
    assert!(SmoothConfig::default().borrow, "on by default");
    let mut s = Smooth::new(SmoothConfig::default());
    for i in 0..400 {
        let _ = s.admit(&seq(3000 + i, 2.0 - (400 - i) as f64 / 50.0, 40, 0, 1.0), &ctx(&[], 2.0));
    }
    assert!(s.admit(&seq(2000, 2.0, 40, 0, 1.0), &ctx(&[], 2.0)).is_err(), "sustained: the wait counts");
    let mut d = Decisions::default();
    s.plan(&ctx(&waiting, 2.0), &mut d);
    assert!(!d.grants.iter().any(|g| g.id == 1000), "sustained: the feed limit holds");
    let seen = s.borrowing().expect("on by default");
    assert!(seen.overloaded && seen.starts == 0, "sustained overload, reported; nothing borrowed: {seen:?}");
    assert!(seen.arrivals == 401 && seen.overloaded_arrivals >= 300, "most of the 401 arrivals judged overloaded: {seen:?}");
}
