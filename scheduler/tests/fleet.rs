//! Replicas behind a router in the simulator (`pace sim --replicas N --routers ...`): each
//! replica is its own scheduler with its own step clock, the router sees them as they stand
//! when a request arrives. Fixed seeds, the `cpu-smollm2` preset's cost model.

use pace_scheduler::policy::by_name;
use pace_scheduler::sim::{preset, run_fleet, saturation_rate, simulate, Fleet, Mode, Retry, Router, SimConfig, SimRequest};
use pace_scheduler::slo::Outcome;

fn cpu() -> (SimConfig, pace_scheduler::sim::Preset) {
    let p = preset("cpu-smollm2").expect("preset");
    (SimConfig::from_preset(&p), p)
}

fn fleet(cfg: &SimConfig, replicas: usize, router: Router) -> SimConfig {
    SimConfig { fleet: Fleet { replicas, router, ..Fleet::default() }, ..cfg.clone() }
}

fn policies(name: &str, n: usize) -> Vec<Box<dyn pace_scheduler::policy::Policy>> {
    (0..n).map(|_| by_name(name).expect("policy")).collect()
}

fn req(arrival: f64, prompt_len: usize, output_len: usize) -> SimRequest {
    SimRequest {
        arrival,
        prompt_len,
        output_len,
        max_tokens: output_len,
        patience: f64::INFINITY,
        priority: 0,
        system: 0,
        turn: None,
        reading_rate: None,
        stop_after: None,
        retry: Retry::default(),
    }
}

/// Four replicas at four times one replica's rate serve each request about as well as one
/// replica at its own rate, and round-robin gives each replica a quarter of the requests.
#[test]
fn four_replicas_carry_four_times_the_load_of_one() {
    let (cfg, p) = cpu();
    let sat = saturation_rate(&cfg, &p.workload, 0, 1);
    let one = p.workload.generate(0.8 * sat, 600, 3);
    let four = p.workload.generate(4.0 * 0.8 * sat, 2400, 3);
    let single = simulate(&cfg, by_name("fcfs").unwrap(), &one).unwrap().evaluate(&cfg.sched.slo).stats;
    let res = run_fleet(&fleet(&cfg, 4, Router::RoundRobin), policies("fcfs", 4), &four, Mode::Open).unwrap();
    let many = res.evaluate(&cfg.sched.slo).stats;
    eprintln!("benefit per request: one replica {:.1}, four {:.1}", single.benefit_per_request, many.benefit_per_request);
    assert!(
        (many.benefit_per_request - single.benefit_per_request).abs() < 0.15 * single.benefit_per_request,
        "one replica {} vs four {}",
        single.benefit_per_request,
        many.benefit_per_request
    );
    let sent = res.replica.len();
    assert!(sent > 1800, "{sent} sent");
    for r in 0..4 {
        let n = res.replica.iter().filter(|&&x| x == r).count();
        assert!(n.abs_diff(sent / 4) <= 1, "replica {r}: {n} of {sent}");
    }
    assert_eq!(res.stats.finished.stop + res.stats.finished.length, res.records.iter().filter(|r| r.outcome == Outcome::Completed).count() as u64);
}

/// A long request holds one of two replicas; short ones keep arriving. While it runs,
/// round-robin sends every other one to the busy replica; least-queue and predicted-wait send
/// them all to the free one, and they start sooner there.
#[test]
fn least_queue_and_predicted_wait_steer_around_a_busy_replica() {
    let (cfg, _) = cpu();
    let cfg = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg };
    let mut reqs = vec![req(0.0, 1500, 300)];
    reqs.extend((0..20).map(|k| req(1.0 + 0.5 * k as f64, 20, 4)));
    let mut ttft = Vec::new();
    for router in [Router::RoundRobin, Router::LeastQueue, Router::PredictedWait] {
        let res = run_fleet(&fleet(&cfg, 2, router), policies("fcfs", 2), &reqs, Mode::Open).unwrap();
        assert!(res.records.iter().all(|r| r.outcome == Outcome::Completed), "{router:?}");
        let (busy, until) = (res.replica[0], res.records[0].end);
        let during: Vec<usize> = (1..reqs.len()).filter(|&i| reqs[i].arrival < until).collect();
        assert!(during.len() >= 8, "the long request ended at {until}");
        let shared = during.iter().filter(|&&i| res.replica[i] == busy).count();
        let first: f64 = res.records[1..].iter().map(|r| r.token_times[0] - r.arrival).sum::<f64>() / 20.0;
        eprintln!("{}: {shared} of {} short requests beside the long one, mean TTFT {first:.3} s", router.name(), during.len());
        match router {
            Router::RoundRobin => assert!(shared.abs_diff(during.len() / 2) <= 1, "{shared} of {}", during.len()),
            _ => assert_eq!(shared, 0, "{router:?}"),
        }
        ttft.push(first);
    }
    assert!(ttft[1] < ttft[0] && ttft[2] < ttft[0], "{ttft:?}");
}

/// One replica behind any router is one server: the router changes nothing.
#[test]
fn one_replica_is_the_same_behind_every_router() {
    let (cfg, p) = cpu();
    let sat = saturation_rate(&cfg, &p.workload, 0, 1);
    let reqs = p.workload.generate(1.5 * sat, 500, 5);
    let run = |router| {
        let res = run_fleet(&fleet(&cfg, 1, router), policies("smooth", 1), &reqs, Mode::Open).unwrap();
        res.records.iter().map(|r| (r.token_times.len(), r.end.to_bits())).collect::<Vec<_>>()
    };
    let base = run(Router::RoundRobin);
    assert_eq!(run(Router::LeastQueue), base);
    assert_eq!(run(Router::PredictedWait), base);
}

/// A router that polls routes by what it saw at its last poll: requests that arrive between
/// two polls all go to the replica that looked least loaded then (herding), where a router that
/// sees the replicas exactly spreads them as their queues grow.
#[test]
fn a_polling_router_herds_between_polls() {
    let (cfg, _) = cpu();
    let cfg = SimConfig { warmup_fraction: 0.0, window_end_fraction: 1.0, ..cfg };
    // One long request, then ten answers of 50 tokens, 0.1 s apart, from t = 1.05 s.
    let mut reqs = vec![req(0.0, 200, 400)];
    reqs.extend((0..10).map(|k| req(1.05 + 0.1 * k as f64, 20, 50)));
    for router in [Router::LeastQueue, Router::LeastTokens] {
        let most = |poll_s: f64| {
            let cfg = SimConfig { fleet: Fleet { replicas: 2, router, poll_s }, ..cfg.clone() };
            let res = run_fleet(&cfg, policies("fcfs", 2), &reqs, Mode::Open).unwrap();
            assert!(res.records.iter().all(|r| r.outcome == Outcome::Completed));
            let on_first = res.replica[1..].iter().filter(|&&r| r == res.replica[1]).count();
            on_first.max(10 - on_first)
        };
        let (exact, polled) = (most(0.0), most(1.0));
        eprintln!("{}: busiest replica got {exact} of 10 seeing exactly, {polled} polling every second", router.name());
        assert_eq!(polled, 10, "{router:?}");
        // Seeing exactly, the count spreads them once the free replica has a queue (the tokens
        // do not: the long request outweighs all ten).
        assert!(router != Router::LeastQueue || exact < 10, "{router:?}");
    }
}
