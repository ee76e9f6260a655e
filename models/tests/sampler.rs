//! Sampler tests: greedy, reproducibility, truncation, penalties against hand-computed values,
//! log-probabilities, parameter validation.

use pace_models::sampler::{Sampler, SamplingParams, MAX_TOP_LOGPROBS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 49152;

fn random_logits(rng: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 20.0 - 10.0).collect()
}

fn sampler(params: SamplingParams, prompt: &[u32]) -> Sampler {
    Sampler::new(params, prompt).unwrap_or_else(|e| panic!("{e}"))
}

fn sample(s: &mut Sampler, logits: &[f32]) -> u32 {
    let mut l = logits.to_vec();
    s.sample(&mut l).unwrap_or_else(|e| panic!("{e}")).token
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for i in 1..l.len() {
        if l[i] > l[best] {
            best = i;
        }
    }
    best as u32
}

#[test]
fn greedy_is_argmax_with_ties_to_the_lowest_id() {
    let mut rng = StdRng::seed_from_u64(1);
    let mut s = sampler(SamplingParams::greedy(), &[]);
    for _ in 0..20 {
        let l = random_logits(&mut rng, VOCAB);
        assert_eq!(sample(&mut s, &l), argmax(&l));
    }
    let mut l = vec![0.0f32; 10];
    l[7] = 3.0;
    l[4] = 3.0;
    assert_eq!(sample(&mut s, &l), 4);
    // NaN never wins and never panics.
    l[2] = f32::NAN;
    assert_eq!(sample(&mut s, &l), 4);
}

#[test]
fn seeded_requests_are_reproducible_and_independent() {
    let mut rng = StdRng::seed_from_u64(2);
    let rows: Vec<Vec<f32>> = (0..64)
        .map(|_| {
            random_logits(&mut rng, 1000)
                .iter()
                .map(|x| x * 0.3)
                .collect()
        })
        .collect();
    let params = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        seed: Some(42),
        ..SamplingParams::default()
    };

    let mut alone = sampler(params.clone(), &[]);
    let a: Vec<u32> = rows.iter().map(|r| sample(&mut alone, r)).collect();

    // Same seed, interleaved with another request drawing from its own generator.
    let mut again = sampler(params.clone(), &[]);
    let mut other = sampler(
        SamplingParams {
            seed: None,
            ..params.clone()
        },
        &[],
    );
    let b: Vec<u32> = rows
        .iter()
        .map(|r| {
            sample(&mut other, r);
            sample(&mut again, r)
        })
        .collect();
    assert_eq!(a, b);

    let mut different = sampler(
        SamplingParams {
            seed: Some(43),
            ..params
        },
        &[],
    );
    let c: Vec<u32> = rows.iter().map(|r| sample(&mut different, r)).collect();
    assert_ne!(
        a, c,
        "a different seed should draw differently over 64 steps"
    );
    assert_eq!(alone.seed(), 42);
}

#[test]
fn truncations_that_leave_one_token_equal_greedy() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut top_k1 = sampler(
        SamplingParams {
            top_k: 1,
            seed: Some(1),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut tiny_p = sampler(
        SamplingParams {
            top_p: 1e-6,
            seed: Some(2),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut min_p1 = sampler(
        SamplingParams {
            min_p: 1.0,
            seed: Some(3),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut k1_hot = sampler(
        SamplingParams {
            top_k: 1,
            temperature: 2.0,
            seed: Some(4),
            ..SamplingParams::default()
        },
        &[],
    );
    for _ in 0..20 {
        let l = random_logits(&mut rng, VOCAB);
        let g = argmax(&l);
        assert_eq!(sample(&mut top_k1, &l), g);
        assert_eq!(sample(&mut tiny_p, &l), g);
        assert_eq!(sample(&mut min_p1, &l), g);
        assert_eq!(sample(&mut k1_hot, &l), g);
    }
}

#[test]
fn top_k_and_top_p_keep_only_the_allowed_tokens() {
    // Probabilities 0.5, 0.3, 0.15, 0.05.
    let l: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let mut k2 = sampler(
        SamplingParams {
            top_k: 2,
            seed: Some(5),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut p7 = sampler(
        SamplingParams {
            top_p: 0.7,
            seed: Some(6),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut p85 = sampler(
        SamplingParams {
            top_p: 0.85,
            seed: Some(7),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut minp = sampler(
        SamplingParams {
            min_p: 0.5,
            seed: Some(8),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut seen = [[0usize; 4]; 4];
    for _ in 0..4000 {
        seen[0][sample(&mut k2, &l) as usize] += 1;
        seen[1][sample(&mut p7, &l) as usize] += 1;
        seen[2][sample(&mut p85, &l) as usize] += 1;
        seen[3][sample(&mut minp, &l) as usize] += 1;
    }
    assert!(
        seen[0][2] == 0 && seen[0][3] == 0 && seen[0][1] > 0,
        "top_k=2: {:?}",
        seen[0]
    );
    // 0.5 < 0.7 <= 0.8: the first two.
    assert!(
        seen[1][2] == 0 && seen[1][3] == 0 && seen[1][1] > 0,
        "top_p=0.7: {:?}",
        seen[1]
    );
    // 0.8 < 0.85 <= 0.95: the first three.
    assert!(
        seen[2][3] == 0 && seen[2][2] > 0,
        "top_p=0.85: {:?}",
        seen[2]
    );
    // min_p 0.5 of 0.5 = 0.25: the first two.
    assert!(
        seen[3][2] == 0 && seen[3][3] == 0 && seen[3][1] > 0,
        "min_p=0.5: {:?}",
        seen[3]
    );
    // top_k=2 renormalises 0.5:0.3 -> 0.625.
    let f = seen[0][0] as f64 / 4000.0;
    assert!((f - 0.625).abs() < 0.03, "{f}");
}

#[test]
fn untruncated_sampling_follows_the_softmax() {
    let probs = [0.5f32, 0.3, 0.2];
    let l: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let mut s = sampler(
        SamplingParams {
            seed: Some(9),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut counts = [0usize; 3];
    let n = 20_000;
    for _ in 0..n {
        counts[sample(&mut s, &l) as usize] += 1;
    }
    for (c, p) in counts.iter().zip(probs) {
        assert!((*c as f32 / n as f32 - p).abs() < 0.015, "{counts:?}");
    }
    // Temperature 0.5 squares the ratios: 0.25 : 0.09 : 0.04.
    let mut cold = sampler(
        SamplingParams {
            temperature: 0.5,
            seed: Some(10),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut counts = [0usize; 3];
    for _ in 0..n {
        counts[sample(&mut cold, &l) as usize] += 1;
    }
    let want = 0.25 / (0.25 + 0.09 + 0.04);
    assert!(
        (counts[0] as f32 / n as f32 - want).abs() < 0.015,
        "{counts:?}"
    );
}

#[test]
fn repetition_penalty_over_prompt_and_output() {
    // Prompt has token 0 (positive logit: divided) and token 1 (negative: multiplied).
    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    };
    let mut s = sampler(params, &[0, 1, 1]);
    let mut l = vec![3.0, -1.0, 2.0, 0.5];
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(2));
    assert_eq!(l, vec![1.5, -2.0, 2.0, 0.5]);
    // Token 2 is now an output token: penalised once, like the prompt tokens.
    let mut l = vec![3.0, -1.0, 2.0, 0.5];
    s.sample(&mut l).ok();
    assert_eq!(l, vec![1.5, -2.0, 1.0, 0.5]);
}

#[test]
fn frequency_and_presence_penalties_over_output_only() {
    let params = SamplingParams {
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::greedy()
    };
    // Token 1 in the prompt is not penalised by frequency/presence.
    let mut s = sampler(params, &[1]);
    let base = [1.0f32, 0.9, 0.0];
    let mut l = base.to_vec();
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(0));
    assert_eq!(l, base.to_vec());
    // count(0) = 1: 1.0 - 0.5 - 0.25 = 0.25.
    let mut l = base.to_vec();
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(1));
    assert_eq!(l, vec![0.25, 0.9, 0.0]);
    // count(0) = 1, count(1) = 1: 0.9 - 0.75 = 0.15.
    let mut l = base.to_vec();
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(0));
    assert!(
        (l[1] - 0.15).abs() < 1e-6 && (l[0] - 0.25).abs() < 1e-6,
        "{l:?}"
    );
    // count(0) = 2: 1.0 - 1.0 - 0.25 = -0.25.
    let mut l = base.to_vec();
    s.sample(&mut l).ok();
    assert!((l[0] + 0.25).abs() < 1e-6, "{l:?}");
    // A negative presence penalty encourages repeats.
    let mut s = sampler(
        SamplingParams {
            presence_penalty: -1.0,
            ..SamplingParams::greedy()
        },
        &[],
    );
    let mut l = vec![1.0, 1.5];
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(1));
    let mut l = vec![2.0, 1.5];
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(1)); // 1.5 + 1 > 2
}

#[test]
fn logprobs_are_a_normalised_log_softmax() {
    let l = vec![1.0f32, 2.0, 0.5, -1.0];
    let mut s = sampler(
        SamplingParams {
            logprobs: Some(4),
            ..SamplingParams::greedy()
        },
        &[],
    );
    let mut x = l.clone();
    let t = s.sample(&mut x).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.token, 1);
    let total: f32 = t.top_logprobs.iter().map(|(_, lp)| lp.exp()).sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    assert_eq!(
        t.top_logprobs.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        vec![1, 0, 2, 3]
    );
    assert_eq!(t.logprob, Some(t.top_logprobs[0].1));
    let lse = l.iter().map(|v| v.exp()).sum::<f32>().ln();
    assert!((t.top_logprobs[0].1 - (2.0 - lse)).abs() < 1e-5);

    // Temperature scales the distribution logprobs are taken from; 0 = sampled token only.
    let mut s = sampler(
        SamplingParams {
            temperature: 0.5,
            logprobs: Some(0),
            seed: Some(11),
            ..SamplingParams::default()
        },
        &[],
    );
    let mut x = l.clone();
    let t = s.sample(&mut x).unwrap_or_else(|e| panic!("{e}"));
    assert!(t.top_logprobs.is_empty());
    let scaled: Vec<f32> = l.iter().map(|v| v / 0.5).collect();
    let lse = scaled.iter().map(|v| v.exp()).sum::<f32>().ln();
    assert!((t.logprob.unwrap_or(0.0) - (scaled[t.token as usize] - lse)).abs() < 1e-5);

    // No logprobs asked: none computed.
    let mut s = sampler(SamplingParams::greedy(), &[]);
    let t = s.sample(&mut l.clone()).unwrap_or_else(|e| panic!("{e}"));
    assert!(t.logprob.is_none() && t.top_logprobs.is_empty());

    // Big vocabulary: top-n is sorted and the sampled token's logprob is consistent.
    let mut rng = StdRng::seed_from_u64(12);
    let big = random_logits(&mut rng, VOCAB);
    let mut s = sampler(
        SamplingParams {
            logprobs: Some(MAX_TOP_LOGPROBS),
            seed: Some(1),
            ..SamplingParams::default()
        },
        &[],
    );
    let t = s.sample(&mut big.clone()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.top_logprobs.len(), MAX_TOP_LOGPROBS);
    assert!(t.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
    assert_eq!(t.top_logprobs[0].0, argmax(&big));
    let lp = t.logprob.unwrap_or(1.0);
    assert!(lp <= 0.0 && lp >= t.top_logprobs[0].1 - 30.0);
}

#[test]
fn invalid_parameters_name_the_parameter() {
    let base = SamplingParams::default();
    let cases: Vec<(SamplingParams, &str)> = vec![
        (
            SamplingParams {
                temperature: -0.1,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: 2.5,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..base.clone()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..base.clone()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: 1.5,
                ..base.clone()
            },
            "top_p",
        ),
        (
            SamplingParams {
                top_p: f32::NAN,
                ..base.clone()
            },
            "top_p",
        ),
        (
            SamplingParams {
                min_p: 1.5,
                ..base.clone()
            },
            "min_p",
        ),
        (
            SamplingParams {
                presence_penalty: 2.5,
                ..base.clone()
            },
            "presence_penalty",
        ),
        (
            SamplingParams {
                frequency_penalty: -2.5,
                ..base.clone()
            },
            "frequency_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..base.clone()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                repetition_penalty: f32::INFINITY,
                ..base.clone()
            },
            "repetition_penalty",
        ),
        (
            SamplingParams {
                logprobs: Some(MAX_TOP_LOGPROBS + 1),
                ..base.clone()
            },
            "logprobs",
        ),
    ];
    for (p, name) in cases {
        assert_eq!(p.validate().map_err(|e| e.param), Err(name), "{p:?}");
        assert_eq!(
            Sampler::new(p, &[]).map(|_| ()).map_err(|e| e.param),
            Err(name)
        );
    }
    // Boundaries that must pass.
    for p in [
        SamplingParams {
            top_p: 1.0,
            temperature: 2.0,
            min_p: 1.0,
            ..base.clone()
        },
        SamplingParams {
            temperature: 0.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            ..base.clone()
        },
        SamplingParams {
            logprobs: Some(MAX_TOP_LOGPROBS),
            top_k: 5,
            ..base.clone()
        },
    ] {
        assert_eq!(p.validate(), Ok(()), "{p:?}");
    }
    // Empty logits are an error, not a panic.
    let mut s = sampler(base, &[]);
    assert!(s.sample(&mut []).is_err());
}

