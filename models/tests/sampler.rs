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
    let rows: Vec<Vec<f32>> = (0..64).map(|_| random_logits(&mut rng, 1000).iter().map(|x| x * 0.3).collect()).collect();
    let params = SamplingParams { temperature: 0.9, top_p: 0.95, seed: Some(42), ..SamplingParams::default() };

    let mut alone = sampler(params.clone(), &[]);
    let a: Vec<u32> = rows.iter().map(|r| sample(&mut alone, r)).collect();

    // Same seed, interleaved with another request drawing from its own generator.
    let mut again = sampler(params.clone(), &[]);
    let mut other = sampler(SamplingParams { seed: None, ..params.clone() }, &[]);
    let b: Vec<u32> = rows
        .iter()
        .map(|r| {
            sample(&mut other, r);
            sample(&mut again, r)
        })
        .collect();
    assert_eq!(a, b);

    let mut different = sampler(SamplingParams { seed: Some(43), ..params }, &[]);
    let c: Vec<u32> = rows.iter().map(|r| sample(&mut different, r)).collect();
    assert_ne!(a, c, "a different seed should draw differently over 64 steps");
    assert_eq!(alone.seed(), 42);
}

#[test]
fn truncations_that_leave_one_token_equal_greedy() {
    let mut rng = StdRng::seed_from_u64(3);
    let mut top_k1 = sampler(SamplingParams { top_k: 1, seed: Some(1), ..SamplingParams::default() }, &[]);
    let mut tiny_p = sampler(SamplingParams { top_p: 1e-6, seed: Some(2), ..SamplingParams::default() }, &[]);
    let mut min_p1 = sampler(SamplingParams { min_p: 1.0, seed: Some(3), ..SamplingParams::default() }, &[]);
    let mut k1_hot = sampler(SamplingParams { top_k: 1, temperature: 2.0, seed: Some(4), ..SamplingParams::default() }, &[]);
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
    let mut k2 = sampler(SamplingParams { top_k: 2, seed: Some(5), ..SamplingParams::default() }, &[]);
    let mut p7 = sampler(SamplingParams { top_p: 0.7, seed: Some(6), ..SamplingParams::default() }, &[]);
    let mut p85 = sampler(SamplingParams { top_p: 0.85, seed: Some(7), ..SamplingParams::default() }, &[]);
    let mut minp = sampler(SamplingParams { min_p: 0.5, seed: Some(8), ..SamplingParams::default() }, &[]);
    let mut seen = [[0usize; 4]; 4];
    for _ in 0..4000 {
        seen[0][sample(&mut k2, &l) as usize] += 1;
        seen[1][sample(&mut p7, &l) as usize] += 1;
        seen[2][sample(&mut p85, &l) as usize] += 1;
        seen[3][sample(&mut minp, &l) as usize] += 1;
    }
    assert!(seen[0][2] == 0 && seen[0][3] == 0 && seen[0][1] > 0, "top_k=2: {:?}", seen[0]);
    // 0.5 < 0.7 <= 0.8: the first two.
    assert!(seen[1][2] == 0 && seen[1][3] == 0 && seen[1][1] > 0, "top_p=0.7: {:?}", seen[1]);
    // 0.8 < 0.85 <= 0.95: the first three.
    assert!(seen[2][3] == 0 && seen[2][2] > 0, "top_p=0.85: {:?}", seen[2]);
    // min_p 0.5 of 0.5 = 0.25: the first two.
    assert!(seen[3][2] == 0 && seen[3][3] == 0 && seen[3][1] > 0, "min_p=0.5: {:?}", seen[3]);
    // top_k=2 renormalises 0.5:0.3 -> 0.625.
    let f = seen[0][0] as f64 / 4000.0;
    assert!((f - 0.625).abs() < 0.03, "{f}");
}

#[test]
fn untruncated_sampling_follows_the_softmax() {
    let probs = [0.5f32, 0.3, 0.2];
    let l: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    let mut s = sampler(SamplingParams { seed: Some(9), ..SamplingParams::default() }, &[]);
    let mut counts = [0usize; 3];
    let n = 20_000;
    for _ in 0..n {
        counts[sample(&mut s, &l) as usize] += 1;
    }
    for (c, p) in counts.iter().zip(probs) {
        assert!((*c as f32 / n as f32 - p).abs() < 0.015, "{counts:?}");
    }
    // Temperature 0.5 squares the ratios: 0.25 : 0.09 : 0.04.
    let mut cold = sampler(SamplingParams { temperature: 0.5, seed: Some(10), ..SamplingParams::default() }, &[]);
    let mut counts = [0usize; 3];
    for _ in 0..n {
        counts[sample(&mut cold, &l) as usize] += 1;
    }
    let want = 0.25 / (0.25 + 0.09 + 0.04);
    assert!((counts[0] as f32 / n as f32 - want).abs() < 0.015, "{counts:?}");
}

#[test]
fn repetition_penalty_over_prompt_and_output() {
    // Prompt has token 0 (positive logit: divided) and token 1 (negative: multiplied).
    let params = SamplingParams { repetition_penalty: 2.0, ..SamplingParams::greedy() };
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
    let params = SamplingParams { frequency_penalty: 0.5, presence_penalty: 0.25, ..SamplingParams::greedy() };
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
    assert!((l[1] - 0.15).abs() < 1e-6 && (l[0] - 0.25).abs() < 1e-6, "{l:?}");
    // count(0) = 2: 1.0 - 1.0 - 0.25 = -0.25.
    let mut l = base.to_vec();
    s.sample(&mut l).ok();
    assert!((l[0] + 0.25).abs() < 1e-6, "{l:?}");
    // A negative presence penalty encourages repeats.
    let mut s = sampler(SamplingParams { presence_penalty: -1.0, ..SamplingParams::greedy() }, &[]);
    let mut l = vec![1.0, 1.5];
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(1));
    let mut l = vec![2.0, 1.5];
    assert_eq!(s.sample(&mut l).map(|t| t.token).ok(), Some(1)); // 1.5 + 1 > 2
}

#[test]
fn logprobs_are_a_normalised_log_softmax() {
    let l = vec![1.0f32, 2.0, 0.5, -1.0];
    let mut s = sampler(SamplingParams { logprobs: Some(4), ..SamplingParams::greedy() }, &[]);
    let mut x = l.clone();
    let t = s.sample(&mut x).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.token, 1);
    let total: f32 = t.top_logprobs.iter().map(|(_, lp)| lp.exp()).sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    assert_eq!(t.top_logprobs.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![1, 0, 2, 3]);
    assert_eq!(t.logprob, Some(t.top_logprobs[0].1));
    let lse = l.iter().map(|v| v.exp()).sum::<f32>().ln();
    assert!((t.top_logprobs[0].1 - (2.0 - lse)).abs() < 1e-5);

    // Temperature scales the distribution logprobs are taken from; 0 = sampled token only.
    let mut s = sampler(SamplingParams { temperature: 0.5, logprobs: Some(0), seed: Some(11), ..SamplingParams::default() }, &[]);
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
    let mut s = sampler(SamplingParams { logprobs: Some(MAX_TOP_LOGPROBS), seed: Some(1), ..SamplingParams::default() }, &[]);
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
        (SamplingParams { temperature: -0.1, ..base.clone() }, "temperature"),
        (SamplingParams { temperature: 2.5, ..base.clone() }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..base.clone() }, "temperature"),
        (SamplingParams { top_p: 0.0, ..base.clone() }, "top_p"),
        (SamplingParams { top_p: 1.5, ..base.clone() }, "top_p"),
        (SamplingParams { top_p: f32::NAN, ..base.clone() }, "top_p"),
        (SamplingParams { min_p: 1.5, ..base.clone() }, "min_p"),
        (SamplingParams { presence_penalty: 2.5, ..base.clone() }, "presence_penalty"),
        (SamplingParams { frequency_penalty: -2.5, ..base.clone() }, "frequency_penalty"),
        (SamplingParams { repetition_penalty: 0.0, ..base.clone() }, "repetition_penalty"),
        (SamplingParams { repetition_penalty: f32::INFINITY, ..base.clone() }, "repetition_penalty"),
        (SamplingParams { logprobs: Some(MAX_TOP_LOGPROBS + 1), ..base.clone() }, "logprobs"),
    ];
    for (p, name) in cases {
        assert_eq!(p.validate().map_err(|e| e.param), Err(name), "{p:?}");
        assert_eq!(Sampler::new(p, &[]).map(|_| ()).map_err(|e| e.param), Err(name));
    }
    // Boundaries that must pass.
    for p in [
        SamplingParams { top_p: 1.0, temperature: 2.0, min_p: 1.0, ..base.clone() },
        SamplingParams { temperature: 0.0, presence_penalty: -2.0, frequency_penalty: 2.0, ..base.clone() },
        SamplingParams { logprobs: Some(MAX_TOP_LOGPROBS), top_k: 5, ..base.clone() },
    ] {
        assert_eq!(p.validate(), Ok(()), "{p:?}");
    }
    // Empty logits are an error, not a panic.
    let mut s = sampler(base, &[]);
    assert!(s.sample(&mut []).is_err());
}

mod constrained {
    //! Sampling under a grammar (structured outputs) over a byte-level vocabulary: whatever the
    //! logits, the output matches the grammar and ends with EOS once the grammar is complete.

    use super::*;
    use pace_models::constraint::{Constraint, GrammarSpec, Grammars, JsonBounds, JsonWhitespace, INT_BOUND};
    use pace_models::tokenizer::Tokenizer;
    use serde_json::{json, Value};
    use std::sync::OnceLock;

    const V: usize = 300;
    const EOS: u32 = 256;

    fn grammars() -> &'static Grammars {
        static G: OnceLock<Grammars> = OnceLock::new();
        G.get_or_init(|| {
            let t = Tokenizer::byte_level(V).unwrap();
            Grammars::new(&t, V).unwrap_or_else(|e| panic!("{e}"))
        })
    }

    fn compile(spec: GrammarSpec) -> Constraint {
        grammars().compile(&spec, &JsonWhitespace::Compact).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Samples with random logits until EOS (or `limit` tokens); returns the text and whether
    /// it ended with EOS.
    fn generate(spec: &GrammarSpec, params: SamplingParams, seed: u64, limit: usize) -> (String, bool) {
        let mut s = sampler(params, &[]).with_constraint(compile(spec.clone()));
        let mut rng = StdRng::seed_from_u64(seed);
        let mut out = Vec::new();
        for _ in 0..limit {
            // Logits that favour EOS and a few bytes, so unconstrained output would be junk.
            let mut l = random_logits(&mut rng, V);
            l[EOS as usize] += 8.0;
            let t = sample(&mut s, &l);
            if t == EOS {
                return (String::from_utf8(out).expect("utf-8"), true);
            }
            assert!(t < 256, "token {t} is not a byte");
            out.push(t as u8);
        }
        (String::from_utf8_lossy(&out).into_owned(), false)
    }

    fn params(t: f32, seed: u64) -> SamplingParams {
        SamplingParams { temperature: t, seed: Some(seed), ..SamplingParams::default() }
    }

    #[test]
    fn regex_and_choice_outputs_match_in_full() {
        for seed in 0..20 {
            for t in [0.0, 1.0] {
                let (text, ended) = generate(&GrammarSpec::Regex("a+b[0-9]{2}".into()), params(t, seed), seed, 40);
                assert!(ended, "seed {seed} t {t}: {text:?} never ended");
                let b = text.as_bytes();
                let n = b.iter().take_while(|&&c| c == b'a').count();
                assert!(n >= 1 && b.len() == n + 3 && b[n] == b'b' && b[n + 1..].iter().all(u8::is_ascii_digit), "{text:?}");

                let choices = vec!["red".to_string(), "green".into(), "blue (dark)".into()];
                let (text, ended) = generate(&GrammarSpec::Choice(choices.clone()), params(t, seed), seed, 40);
                assert!(ended && choices.contains(&text), "{text:?}");
            }
        }
    }

    fn check_person(v: &Value) {
        let o = v.as_object().unwrap_or_else(|| panic!("not an object: {v}"));
        let age = o["age"].as_i64().unwrap_or_else(|| panic!("age: {v}"));
        assert!((0..=120).contains(&age), "{v}");
        assert!(["cat", "dog"].contains(&o["pet"].as_str().unwrap()), "{v}");
        let tags = o["tags"].as_array().unwrap();
        assert!((1..=3).contains(&tags.len()), "{v}");
        assert!(tags.iter().all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 5)), "{v}");
        let home = o["home"].as_object().unwrap();
        assert!(home["city"].as_str().unwrap().chars().count() <= 8, "{v}");
        assert!(home["zip"].is_boolean(), "{v}");
        assert!(o.len() == 4 || (o.len() == 5 && o["nick"].is_string()), "{v}");
    }

    #[test]
    fn json_schema_outputs_parse_and_validate() {
        let schema = json!({
            "type": "object",
            "properties": {
                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "pet": {"enum": ["cat", "dog"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "minItems": 1, "maxItems": 3},
                "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "zip": {"type": "boolean"}},
                         "required": ["city", "zip"], "additionalProperties": false},
                "nick": {"type": "string", "maxLength": 4}
            },
            "required": ["age", "pet", "tags", "home"],
            "additionalProperties": false
        });
        let spec = GrammarSpec::JsonSchema(schema);
        for seed in 0..12 {
            for t in [0.0, 1.0] {
                let (text, ended) = generate(&spec, params(t, seed), seed, 400);
                assert!(ended, "seed {seed} t {t}: {text:?} never ended");
                let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
                check_person(&v);
                // Compact layout: ", " and ": " only.
                assert!(!text.contains('\n') && !text.contains("  "), "{text:?}");
            }
        }
        // json_object: any object.
        for seed in 0..5 {
            let (text, ended) = generate(&GrammarSpec::JsonObject, params(1.0, seed), seed, 2000);
            if ended {
                // Valid JSON; serde_json refuses only numbers beyond f64 (JSON itself allows them).
                match serde_json::from_str::<Value>(&text) {
                    Ok(v) => assert!(v.is_object(), "{text:?}"),
                    Err(e) => assert!(e.to_string().contains("number out of range"), "{e}: {text:?}"),
                }
            } else {
                assert!(text.starts_with('{'), "{text:?}");
            }
        }
    }

    #[test]
    fn eos_is_allowed_only_when_the_grammar_accepts() {
        let mut c = compile(GrammarSpec::Regex("ab?".into()));
        assert!(c.allows(b'a' as u32) && !c.allows(b'b' as u32) && !c.allows(EOS));
        c.commit(b'a' as u32);
        assert!(c.allows(b'b' as u32) && c.allows(EOS) && !c.allows(b'a' as u32));
        assert!(!c.is_finished());
        c.commit(b'b' as u32);
        // Nothing can follow "ab": only EOS.
        assert!(c.allows(EOS) && (0..256).all(|t| !c.allows(t)));
        // A clone is independent.
        let mut a = compile(GrammarSpec::Regex("(xy)|(xz)".into()));
        a.commit(b'x' as u32);
        let mut b = a.clone();
        a.commit(b'y' as u32);
        assert!(b.allows(b'z' as u32) && b.allows(b'y' as u32));
        assert!(!a.allows(b'z' as u32));
    }

    #[test]
    fn masked_logprobs_and_penalties_stay_inside_the_grammar() {
        let p = SamplingParams {
            temperature: 0.0,
            logprobs: Some(5),
            repetition_penalty: 1.5,
            frequency_penalty: -2.0,
            presence_penalty: -2.0,
            ..SamplingParams::default()
        };
        let mut s = sampler(p, &[b'z' as u32]).with_constraint(compile(GrammarSpec::Regex("[xy]z".into())));
        let mut l = vec![0.0f32; V];
        l[b'z' as usize] = 50.0;
        l[b'y' as usize] = 1.0;
        let tok = s.sample(&mut l).unwrap();
        assert_eq!(tok.token, b'y' as u32);
        // Two allowed ids: x and y; their probabilities sum to 1.
        assert_eq!(tok.top_logprobs.len(), 2, "{:?}", tok.top_logprobs);
        let total: f32 = tok.top_logprobs.iter().map(|(_, lp)| lp.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5 && tok.logprob.unwrap().is_finite());
        // The negative penalties favour 'y' (seen) and 'z' (prompt), but only z is allowed.
        let mut l = vec![0.0f32; V];
        l[b'y' as usize] = 9.0;
        assert_eq!(s.sample(&mut l).unwrap().token, b'z' as u32);
    }

    #[test]
    fn json_bounds_reach_every_subschema_and_keep_the_schemas_own() {
        let b = JsonBounds { max_length: 7, max_items: 3 };
        let s = b.apply(json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer"},
                "low": {"type": "integer", "minimum": 5},
                "huge": {"type": "integer", "minimum": 2e18},
                "s": {"type": ["string", "null"], "minLength": 9},
                "own": {"type": "string", "maxLength": 100},
                "pat": {"type": "string", "pattern": "^a+$"},
                "e": {"type": "integer", "enum": [1, 2]},
                "list": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/word"}]}}
            },
            "additionalProperties": false,
            "$defs": {"word": {"type": "string"}}
        }));
        let p = &s["properties"];
        assert_eq!((p["n"]["minimum"].as_f64(), p["n"]["maximum"].as_f64()), (Some(-INT_BOUND), Some(INT_BOUND)));
        assert_eq!((p["low"]["minimum"].as_f64(), p["low"]["maximum"].as_f64()), (Some(5.0), Some(INT_BOUND)));
        assert!(p["huge"].get("maximum").is_none(), "no bound below the schema's own: {s}");
        assert_eq!(p["s"]["maxLength"], 9, "at least minLength");
        assert_eq!(p["own"]["maxLength"], 100);
        assert!(p["pat"].get("maxLength").is_none() && p["e"].get("minimum").is_none());
        assert_eq!(p["list"]["maxItems"], 3);
        assert_eq!(p["list"]["items"]["anyOf"][0]["maximum"].as_f64(), Some(INT_BOUND));
        assert_eq!(s["$defs"]["word"]["maxLength"], 7);
        let tuple = b.apply(json!({"type": "array", "items": [{"type": "integer"}, {"type": "string"}]}));
        assert_eq!((tuple["items"][0]["maximum"].as_f64(), &tuple["items"][1]["maxLength"]), (Some(INT_BOUND), &json!(7)), "{tuple}");
        assert!(s.get("maxProperties").is_none(), "a closed object is bounded by its names: {s}");
        assert_eq!(b.apply(json!({"type": "object", "properties": {"a": {}}}))["maxProperties"], 3);
    }

    /// Logits that favour `favour` over everything else, EOS included: a model stuck on one
    /// byte. Returns the text and whether it ended within `limit` tokens.
    fn generate_stuck(g: &Grammars, spec: &GrammarSpec, favour: &[u8], limit: usize) -> (String, bool) {
        let c = g.compile(spec, &JsonWhitespace::Compact).unwrap_or_else(|e| panic!("{e}"));
        let mut s = sampler(params(0.0, 0), &[]).with_constraint(c);
        let mut out = Vec::new();
        for _ in 0..limit {
            let mut l = vec![0.0f32; V];
            for (i, &b) in favour.iter().enumerate() {
                l[b as usize] = 20.0 - i as f32;
            }
            let t = sample(&mut s, &l);
            if t == EOS {
                return (String::from_utf8(out).expect("utf-8"), true);
            }
            out.push(t as u8);
        }
        (String::from_utf8_lossy(&out).into_owned(), false)
    }

    #[test]
    fn a_model_stuck_in_a_value_reaches_a_valid_end() {
        let t = Tokenizer::byte_level(V).unwrap();
        let g = Grammars::new(&t, V).unwrap().with_json_bounds(JsonBounds { max_length: 10, max_items: 3 });
        let closed = |props: Value| json!({"type": "object", "properties": props, "required": ["v"], "additionalProperties": false});
        // An integer: at most 19 digits, then it must close (issue: "811122232312344888...").
        let (text, ended) = generate_stuck(&g, &GrammarSpec::JsonSchema(closed(json!({"v": {"type": "integer"}}))), b"8", 60);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(ended && v["v"].as_i64().is_some_and(|n| (n as f64).abs() <= INT_BOUND), "{text:?}");
        // A string of one letter, and an array of such integers.
        let (text, ended) = generate_stuck(&g, &GrammarSpec::JsonSchema(closed(json!({"v": {"type": "string"}}))), b"a", 60);
        assert!(ended && text == r#"{"v": "aaaaaaaaaa"}"#, "{text:?}");
        let list = closed(json!({"v": {"type": "array", "items": {"type": "integer"}}}));
        let (text, ended) = generate_stuck(&g, &GrammarSpec::JsonSchema(list), b"8,", 120);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(ended && v["v"].as_array().is_some_and(|a| a.len() == 3), "{text:?}");
        // The schema's own bound wins over the default.
        let own = closed(json!({"v": {"type": "string", "maxLength": 20}}));
        let (text, _) = generate_stuck(&g, &GrammarSpec::JsonSchema(own), b"a", 60);
        assert_eq!(text.matches('a').count(), 20, "{text:?}");
        // json_object: every value is bounded the same way.
        let (text, ended) = generate_stuck(&g, &GrammarSpec::JsonObject, b"\"a", 200);
        assert!(ended && serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()), "{text:?}");
    }

    #[test]
    fn bad_grammars_are_errors_with_a_message() {
        let g = grammars();
        for spec in [
            GrammarSpec::Regex("(a".into()),
            GrammarSpec::Lark("start: foo".into()),
            GrammarSpec::JsonSchema(json!({"type": "nonsense"})),
            GrammarSpec::JsonSchema(json!(["not", "an", "object"])),
            GrammarSpec::Choice(vec![]),
        ] {
            let e = g.compile(&spec, &JsonWhitespace::Compact).err().unwrap_or_else(|| panic!("{spec:?} compiled"));
            assert!(!e.is_empty());
        }
        assert!(g.compile(&GrammarSpec::Lark("start: \"hi\" NUM\nNUM: /[0-9]+/".into()), &JsonWhitespace::Compact).is_ok());
    }
}
