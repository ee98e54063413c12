use super::*;
use crate::pod_check::lm::log_sum_exp;

fn warmup(first: Option<u32>, logits_atol: f64) -> Warmup {
    let mut w: Warmup = serde_json::from_value(json!({"fixtureVersion": "v1"})).expect("warmup");
    w.outputs = vec![
        serde_json::from_value(json!({"name": "tokens", "atol": 0.0, "rtol": 0.0})).expect("tol"),
        serde_json::from_value(json!({"name": "logits", "atol": logits_atol, "rtol": 0.0}))
            .expect("tol"),
    ];
    w.outputs[0].first_elements = first;
    w
}

fn sample(tokens: &[i32], logits: &[f64]) -> Sample {
    Sample {
        prompt: vec![1, 2, 3],
        generate: tokens.len(),
        tokens: tokens.to_vec(),
        logits: Some(logits.to_vec()),
    }
}

fn answer(tokens: &[i32], stop: &str, first: (i32, f64)) -> Completion {
    Completion {
        tokens: tokens.to_vec(),
        stop_type: stop.into(),
        completion_probabilities: vec![Probability {
            id: first.0,
            logprob: first.1,
        }],
    }
}

/// log-softmax of `logits` at `i`.
fn logprob(logits: &[f64], i: usize) -> f64 {
    logits[i] - log_sum_exp(logits)
}

const LOGITS: [f64; 4] = [0.5, 3.0, -1.0, 2.0];

#[test]
fn the_same_greedy_tokens_and_log_probability_pass() {
    let s = sample(&[1, 3, 1], &LOGITS);
    let a = answer(&[1, 3, 1], "limit", (1, logprob(&LOGITS, 1) + 1e-4));
    let error = judge(&a, &s, &warmup(None, 1e-3)).expect("within");
    assert!((error - 1e-4).abs() < 1e-9, "{error}");
}

#[test]
fn a_different_token_within_k_fails_and_one_after_k_does_not() {
    let s = sample(&[1, 3, 1, 0], &LOGITS);
    let lp = (1, logprob(&LOGITS, 1));
    let early = answer(&[1, 0, 1, 0], "limit", lp);
    let cold = judge(&early, &s, &warmup(Some(2), 1e-3)).expect_err("position 1 differs");
    assert_eq!(cold.reason(), "ServingParityExceeded");
    assert!(cold.message().contains("position 1: 0 where 3"), "{cold:?}");
    let late = answer(&[1, 3, 2, 2], "limit", lp);
    judge(&late, &s, &warmup(Some(2), 1e-3)).expect("only the first two are checked");
    judge(&late, &s, &warmup(None, 1e-3)).expect_err("all four when K is unset");
}

#[test]
fn an_answer_may_end_early_only_at_end_of_generation() {
    let s = sample(&[1, 3, 2, 0], &LOGITS);
    let lp = (1, logprob(&LOGITS, 1));
    // The server sampled end-of-generation (id 2) at position 2, as the golden run did.
    judge(&answer(&[1, 3, 2], "eos", lp), &s, &warmup(None, 1e-3)).expect("eos at the golden 2");
    let cut = judge(&answer(&[1, 3], "limit", lp), &s, &warmup(None, 1e-3)).expect_err("short");
    assert_eq!(cut.reason(), "ServingMalformed");
    // An end of generation where the golden run went on is a wrong token.
    let wrong = judge(&answer(&[1, 0], "eos", lp), &s, &warmup(None, 1e-3)).expect_err("0 not 3");
    assert_eq!(wrong.reason(), "ServingParityExceeded");
    // A server that stops at once is judged on what it sampled, not passed for saying nothing.
    let none = judge(&answer(&[0], "eos", lp), &s, &warmup(None, 1e-3)).expect_err("0 not 1");
    assert_eq!(none.reason(), "ServingParityExceeded");
}

#[test]
fn the_first_log_probability_is_held_to_twice_the_logits_tolerance() {
    let s = sample(&[1], &LOGITS);
    let want = logprob(&LOGITS, 1);
    judge(
        &answer(&[1], "limit", (1, want + 1.9e-3)),
        &s,
        &warmup(None, 1e-3),
    )
    .expect("inside");
    let cold = judge(
        &answer(&[1], "limit", (1, want + 2.1e-3)),
        &s,
        &warmup(None, 1e-3),
    )
    .expect_err("out");
    assert_eq!(cold.reason(), "ServingParityExceeded");
    assert!(cold.message().contains("log-probability"), "{cold:?}");
    let outside = judge(&answer(&[1], "limit", (9, 0.0)), &s, &warmup(None, 1e-3)).expect_err("id");
    assert_eq!(outside.reason(), "ServingMismatch");
    let mut bare = answer(&[1], "limit", (1, want));
    bare.completion_probabilities.clear();
    assert_eq!(
        judge(&bare, &s, &warmup(None, 1e-3))
            .expect_err("no probs")
            .reason(),
        "ServingMalformed"
    );
    let nan = judge(
        &answer(&[1], "limit", (1, f64::NAN)),
        &s,
        &warmup(None, 1e-3),
    );
    assert_eq!(nan.expect_err("NaN").reason(), "ServingParityExceeded");
}

#[test]
fn log_sum_exp_is_stable_for_large_logits() {
    let v = [1000.0, 1000.0];
    assert!((log_sum_exp(&v) - (1000.0 + 2f64.ln())).abs() < 1e-9);
    assert_eq!(log_sum_exp(&[]), f64::NEG_INFINITY);
}

#[test]
fn differences_name_the_first_position_and_both_lengths() {
    assert_eq!(first_difference(&[1, 2], &[1, 2]), None);
    assert_eq!(
        first_difference(&[1, 2], &[1, 2, 3]).as_deref(),
        Some("position 2: nothing where 3 was expected (2 against 3 ids)")
    );
}
