use super::*;
use crate::pod_check::lm::log_sum_exp;

fn warmup(first: Option<u32>) -> Warmup {
    let mut w: Warmup = serde_json::from_value(json!({"fixtureVersion": "v1"})).expect("warmup");
    w.outputs = vec![
        serde_json::from_value(json!({"name": "tokens", "atol": 0.0, "rtol": 0.0})).expect("tol"),
        serde_json::from_value(json!({"name": "logits", "atol": 1e-3, "rtol": 0.0})).expect("tol"),
    ];
    w.outputs[0].first_elements = first;
    w
}

const LOGITS: [f64; 4] = [0.5, 3.0, -1.0, 2.0];

fn asked(tokens: &[i32], continuation: &str) -> Asked {
    Asked {
        route: "/v1/completions",
        body: json!({}),
        sample: Sample {
            prompt: vec![1, 2, 3],
            generate: tokens.len(),
            tokens: tokens.to_vec(),
            logits: Some(LOGITS.to_vec()),
        },
        continuation: continuation.into(),
    }
}

fn logprob(i: usize) -> f64 {
    LOGITS[i] - log_sum_exp(&LOGITS)
}

/// An answer in llama-server's shape (ids in `content`), or vLLM's legacy completions shape
/// (`token_id:N` strings), or with no ids at all.
fn answer(shape: &str, ids: &[i32], text: &str, finish: &str, prompt: u64) -> Answer {
    let lp: Vec<f64> = ids.iter().map(|&i| logprob(i as usize)).collect();
    let logprobs = match shape {
        "llama" => {
            json!({"content": ids.iter().zip(&lp).map(|(i, l)| json!({"id": i, "token": "x", "logprob": l})).collect::<Vec<_>>()})
        }
        "vllm" => {
            json!({"tokens": ids.iter().map(|i| format!("token_id:{i}")).collect::<Vec<_>>(), "token_logprobs": lp})
        }
        _ => {
            json!({"content": lp.iter().map(|l| json!({"token": "x", "logprob": l})).collect::<Vec<_>>()})
        }
    };
    serde_json::from_value(json!({
        "choices": [{"text": text, "finish_reason": finish, "logprobs": logprobs}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": ids.len()},
    }))
    .expect("answer")
}

#[test]
fn the_golden_tokens_pass_in_every_shape() {
    let a = asked(&[1, 3, 1], " hot and dry");
    for shape in ["llama", "vllm", "text"] {
        let got = answer(shape, &[1, 3, 1], " hot and dry", "length", 3);
        let error = judge(&got, &a, &warmup(None)).unwrap_or_else(|c| panic!("{shape}: {c:?}"));
        assert!(error < 1e-9, "{shape}: {error}");
    }
}

#[test]
fn a_different_token_within_k_fails_naming_it_and_both_texts() {
    let a = asked(&[1, 3, 1, 0], " hot and dry");
    for shape in ["llama", "vllm"] {
        let got = answer(shape, &[1, 0], " hot but", "length", 3);
        let cold = judge(&got, &a, &warmup(Some(2))).expect_err("position 1");
        assert_eq!(cold.reason(), "ServingParityExceeded", "{shape}");
        assert!(cold.message().contains("position 1: 0 where 3"), "{cold:?}");
        assert!(cold.message().contains("\" hot but\""), "{cold:?}");
        assert!(cold.message().contains("\" hot and dry\""), "{cold:?}");
    }
    // Beyond K nothing is compared.
    let got = answer("llama", &[1, 3], " hot and", "length", 3);
    judge(&got, &a, &warmup(Some(2))).expect("the first two only");
}

#[test]
fn as_text_the_answer_is_the_start_of_the_golden_continuation() {
    let a = asked(&[1, 3, 1, 0], " hot and dry.");
    // K tokens of text, a prefix; a server that trims the leading space passes too.
    for text in [" hot and", "hot and", "hot and "] {
        let got = answer("text", &[1, 3], text, "length", 3);
        judge(&got, &a, &warmup(Some(2))).unwrap_or_else(|c| panic!("{text:?}: {c:?}"));
    }
    let got = answer("text", &[1, 3], " hot or", "length", 3);
    let cold = judge(&got, &a, &warmup(Some(2))).expect_err("differs");
    assert_eq!(cold.reason(), "ServingParityExceeded");
    assert!(cold.message().contains("character 4"), "{cold:?}");
    // Whitespace inside is compared.
    let got = answer("text", &[1, 3], "hot  and", "length", 3);
    judge(&got, &a, &warmup(Some(2))).expect_err("two spaces");
}

#[test]
fn an_early_stop_passes_only_where_the_reference_stopped_too() {
    // The reference ended after two tokens (its continuation is their text).
    let ended = asked(&[1, 3], " hot");
    let got = answer("llama", &[1, 3], " hot", "stop", 3);
    judge(&got, &ended, &warmup(Some(4))).expect("stopped where the reference did");
    let got = answer("text", &[1, 3], " hot", "stop", 3);
    judge(&got, &ended, &warmup(Some(4))).expect("as text too");
    // The reference went on: a stop after two of four is a difference, not a pass.
    let went_on = asked(&[1, 3, 1, 0], " hot and dry");
    let got = answer("llama", &[1, 3], " hot", "stop", 3);
    let cold = judge(&got, &went_on, &warmup(Some(4))).expect_err("ended early");
    assert_eq!(cold.reason(), "ServingParityExceeded");
    let got = answer("text", &[1, 3], " hot", "stop", 3);
    judge(&got, &went_on, &warmup(Some(4))).expect_err("ended early, as text");
    // Fewer tokens without a stop is not the protocol.
    let got = answer("llama", &[1, 3], " hot", "length", 3);
    let cold = judge(&got, &went_on, &warmup(Some(4))).expect_err("short");
    assert_eq!(cold.reason(), "ServingMalformed");
}

#[test]
fn another_prompt_length_is_another_template_or_tokenizer() {
    let a = asked(&[1, 3, 1], " hot and dry");
    let got = answer("llama", &[1, 3, 1], " hot and dry", "length", 7);
    let cold = judge(&got, &a, &warmup(None)).expect_err("prompt of 7");
    assert_eq!(cold.reason(), "ServingMismatch");
    assert!(
        cold.message().contains("chat template or tokenizer"),
        "{cold:?}"
    );
}

#[test]
fn the_first_log_probability_is_held_to_the_logits_tolerance() {
    let a = asked(&[1, 3, 1], " hot and dry");
    let mut got = answer("llama", &[1, 3, 1], " hot and dry", "length", 3);
    if let Some(c) = got.choices[0]
        .logprobs
        .as_mut()
        .and_then(|l| l.content.as_mut())
    {
        c[0].logprob = Some(logprob(1) + 0.5);
    }
    let cold = judge(&got, &a, &warmup(None)).expect_err("0.5 off");
    assert_eq!(cold.reason(), "ServingParityExceeded");
    assert!(cold.message().contains("log-probability"), "{cold:?}");
    // No logprobs at all, though asked.
    let mut bare = answer("llama", &[1, 3, 1], " hot and dry", "length", 3);
    bare.choices[0].logprobs = None;
    let cold = judge(&bare, &a, &warmup(None)).expect_err("none");
    assert_eq!(cold.reason(), "ServingMalformed");
    // An answer without choices.
    let cold = judge(&Answer::default(), &a, &warmup(None)).expect_err("empty");
    assert_eq!(cold.reason(), "ServingMalformed");
}

#[test]
fn the_request_is_greedy_and_asks_for_what_is_checked() {
    use kiln_engines::pipeline::fixtures::TextFixture;
    let mut fixture = FixtureFile {
        version: "v1".into(),
        model_sha256: None,
        tolerance: None,
        inputs: Default::default(),
        outputs: Default::default(),
        more: Vec::new(),
        text: TextFixture::default(),
    };
    let ids = |v: &[i32]| kiln_engines::backend::tensor::HostTensor {
        dtype: safetensors::Dtype::I32,
        shape: vec![v.len()],
        data: v.iter().flat_map(|i| i.to_le_bytes()).collect(),
    };
    fixture.inputs.insert("prompt".into(), ids(&[1, 2, 3]));
    fixture.inputs.insert("generate".into(), ids(&[4]));
    fixture.outputs.insert("tokens".into(), ids(&[1, 3, 1, 0]));
    let refused = Asked::of(&fixture, "m", &warmup(Some(2))).expect_err("no text");
    assert_eq!(refused.reason(), "ServingMismatch");
    fixture.text = TextFixture {
        prompt: Some("The kiln".into()),
        continuation: Some(" hot and dry".into()),
        ..TextFixture::default()
    };
    let plain = Asked::of(&fixture, "m", &warmup(Some(2))).expect("plain");
    assert_eq!(plain.route, "/v1/completions");
    assert_eq!(plain.body["prompt"], "The kiln");
    assert_eq!(plain.body["max_tokens"], 2);
    assert_eq!(plain.body["temperature"], 0.0);
    assert_eq!(plain.body["model"], "m");
    assert_eq!(plain.body["logprobs"], 1);
    assert_eq!(
        (
            plain.body["repeat_penalty"].as_f64(),
            plain.body["top_p"].as_f64()
        ),
        (Some(1.0), Some(1.0))
    );
    fixture.text.chat = Some(r#"[{"role": "user", "content": "hi"}]"#.into());
    let chat = Asked::of(&fixture, "m", &warmup(None)).expect("chat");
    assert_eq!(chat.route, "/v1/chat/completions");
    assert_eq!(chat.body["messages"][0]["content"], "hi");
    assert_eq!(chat.body["max_tokens"], 4);
    assert_eq!(chat.body["logprobs"], true);
    fixture.text.chat = Some(r#"{"role": "user"}"#.into());
    let cold = Asked::of(&fixture, "m", &warmup(None)).expect_err("not a list");
    assert_eq!(cold.reason(), "ServingMismatch");
}
