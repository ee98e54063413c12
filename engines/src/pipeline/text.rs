//! A language-model fixture's text checked against the artifact's own tokenizer and chat
//! template, before any run: the template that renders the fixture's chat messages must be the
//! one it was made with (`ChatTemplateMismatch`, both digests), its rendering the fixture's
//! prompt; the prompt must tokenize to the reference tokenizer's ids (`TokenizerMismatch`,
//! naming the first differing position and both pieces); the golden continuation must
//! detokenize to the fixture's text. Pure but for the [`Tokenizer`] it asks.

use kiln_store::staged::sha256_bytes;

use crate::backend::Tokenizer;
use crate::pipeline::fixtures::{FixtureFile, TextFixture};
use kiln_node_core::error::{Error, Result};

/// A language model's fixture from text: the reference tokenizer gives the prompt's ids, the
/// reference run the logits and greedy tokens, and the fixture records the text beside them.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub struct TextRequest {
    /// The prompt (`--prompt`), or chat messages as a JSON list of `{role, content}`
    /// (`--chat`), rendered by the model's own chat template.
    pub prompt: TextPrompt,
    /// Tokens to continue greedily.
    pub generate: u32,
    /// A chat template given beside the model (`--chat-template`), rendering the chat in place
    /// of the model's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

/// Plain text or chat messages.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
#[serde(rename_all = "camelCase")]
pub enum TextPrompt {
    /// A prompt as it is.
    Plain(String),
    /// Chat messages (JSON), rendered by the model's chat template.
    Chat(String),
}

/// Input and output tensors a language-model fixture's text is about.
const PROMPT: &str = "prompt";
const TOKENS: &str = "tokens";

/// Chat messages (role, content) from the fixture's JSON list of `{role, content}`.
pub fn messages(json: &str) -> std::result::Result<Vec<(String, String)>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Message {
        role: String,
        content: String,
    }
    let list: Vec<Message> = serde_json::from_str(json).map_err(|e| {
        format!("chat messages are a JSON list of {{\"role\", \"content\"}} strings: {e}")
    })?;
    if list.is_empty() {
        return Err("chat messages: the list is empty; give at least one message".into());
    }
    if let Some(m) = list
        .iter()
        .find(|m| m.role.contains('\0') || m.content.contains('\0'))
    {
        return Err(format!(
            "chat messages: a {:?} message holds a NUL character; remove it",
            m.role
        ));
    }
    Ok(list.into_iter().map(|m| (m.role, m.content)).collect())
}

/// The prompt of a fixture's text and whether a chat template rendered it: the plain prompt, or
/// the chat messages rendered by the model's template, whose sha256 must be the fixture's.
pub fn prompt(tok: &dyn Tokenizer, text: &TextFixture) -> Result<Option<(String, bool)>> {
    let Some(chat) = &text.chat else {
        return Ok(text.prompt.clone().map(|p| (p, false)));
    };
    let template = tok.chat_template().ok_or_else(|| {
        Error::ChatTemplateMismatch(
            "the fixture holds chat messages, but this model carries no chat template (tokenizer.chat_template) and none was given beside it (a spec.assets entry of kind chatTemplate)".into(),
        )
    })?;
    let have = sha256_bytes(template.as_bytes());
    if let Some(want) = &text.chat_template_sha256
        && *want != have
    {
        return Err(Error::ChatTemplateMismatch(format!(
            "the model's chat template has sha256 {have}, the fixture was rendered with {want}; the template changed: regenerate the fixture (kiln-agent fixtures --chat) if the new template is intended"
        )));
    }
    let messages = messages(chat).map_err(Error::InvalidSpec)?;
    let rendered = tok.render(&messages)?;
    if let Some(want) = &text.prompt
        && *want != rendered
    {
        return Err(Error::ChatTemplateMismatch(format!(
            "the chat template renders the fixture's messages to {rendered:?}, the fixture says {want:?}"
        )));
    }
    Ok(Some((rendered, true)))
}

/// Checks the fixture's text against the engine's tokenizer: nothing for a fixture without
/// text; a fixture with text on an engine without a tokenizer is refused.
pub fn check(tok: Option<&dyn Tokenizer>, fixture: &FixtureFile) -> Result<()> {
    let text = &fixture.text;
    if text.is_empty() {
        return Ok(());
    }
    let tok = tok.ok_or_else(|| {
        Error::InvalidSpec(format!(
            "fixture {} holds a prompt as text, but this engine has no tokenizer (only a language model's does)",
            fixture.version
        ))
    })?;
    if let Some((prompt, rendered)) = prompt(tok, text)? {
        let want = ids(fixture.inputs.get(PROMPT), "input", PROMPT)?;
        let have = tok.encode(&prompt, rendered)?;
        if let Some(m) = first_difference(tok, &want, &have) {
            return Err(Error::TokenizerMismatch(format!(
                "the model's tokenizer turns the fixture's prompt into other tokens than the reference did: {m}"
            )));
        }
    }
    if let Some(want) = &text.continuation {
        let golden = ids(fixture.outputs.get(TOKENS), "output", TOKENS)?;
        let have = tok.decode(&golden)?;
        if have != *want {
            return Err(Error::TokenizerMismatch(format!(
                "the model's tokenizer detokenizes the golden continuation to {have:?}, the reference to {want:?}"
            )));
        }
    }
    Ok(())
}

fn ids(
    tensor: Option<&crate::backend::tensor::HostTensor>,
    what: &str,
    name: &str,
) -> Result<Vec<i32>> {
    tensor.and_then(|t| t.i32s()).ok_or_else(|| {
        Error::InvalidSpec(format!(
            "a fixture with text needs {what} {name} as i32 token ids"
        ))
    })
}

/// Where two token sequences first differ, with both tokens as this model's vocabulary spells
/// them (the reference's own spelling is not at hand: only its ids are in the fixture), or
/// `None` when they are equal.
pub fn first_difference(tok: &dyn Tokenizer, want: &[i32], have: &[i32]) -> Option<String> {
    let piece = |ids: &[i32], i: usize| {
        ids.get(i).map_or("(the end)".to_string(), |id| {
            format!("{id} {:?}", tok.piece(*id))
        })
    };
    let at = (0..want.len().max(have.len())).find(|&i| want.get(i) != have.get(i))?;
    Some(format!(
        "position {at}: the reference's token {}, the model's {} (as this model's vocabulary spells them; {} and {} tokens)",
        piece(want, at),
        piece(have, at),
        want.len(),
        have.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tensor::HostTensor;
    use safetensors::Dtype;
    use std::collections::BTreeMap;

    /// A word-level tokenizer: id = index in `vocab`, a leading `<s>` for plain prompts.
    struct Words {
        vocab: Vec<&'static str>,
        template: Option<&'static str>,
    }

    impl Tokenizer for Words {
        fn encode(&self, text: &str, rendered: bool) -> Result<Vec<i32>> {
            let lead = (!rendered).then_some(0);
            Ok(lead
                .into_iter()
                .chain(
                    text.split(' ')
                        .map(|w| self.vocab.iter().position(|v| *v == w).unwrap_or(1) as i32),
                )
                .collect())
        }
        fn piece(&self, id: i32) -> String {
            self.vocab[id as usize].to_string()
        }
        fn decode(&self, ids: &[i32]) -> Result<String> {
            Ok(ids
                .iter()
                .map(|i| self.piece(*i))
                .collect::<Vec<_>>()
                .join(" "))
        }
        fn chat_template(&self) -> Option<String> {
            self.template.map(str::to_string)
        }
        fn render(&self, messages: &[(String, String)]) -> Result<String> {
            Ok(messages
                .iter()
                .map(|(r, c)| format!("{r} {c}"))
                .collect::<Vec<_>>()
                .join(" "))
        }
    }

    fn t(w: &Words) -> Option<&dyn Tokenizer> {
        Some(w)
    }

    fn words() -> Words {
        Words {
            vocab: vec!["<s>", "<unk>", "user", "kiln", "warms", "models", "fast"],
            template: Some("{role} {content}"),
        }
    }

    fn i32s(v: &[i32]) -> HostTensor {
        HostTensor {
            dtype: Dtype::I32,
            shape: vec![v.len()],
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    fn fixture(prompt: &[i32], tokens: &[i32], text: TextFixture) -> FixtureFile {
        FixtureFile {
            version: "v1".into(),
            model_sha256: None,
            tolerance: None,
            inputs: BTreeMap::from([("prompt".into(), i32s(prompt))]),
            outputs: BTreeMap::from([("tokens".into(), i32s(tokens))]),
            more: Vec::new(),
            text,
        }
    }

    fn plain(prompt: &str, continuation: &str) -> TextFixture {
        TextFixture {
            prompt: Some(prompt.into()),
            continuation: Some(continuation.into()),
            ..TextFixture::default()
        }
    }

    #[test]
    fn the_same_tokenizer_passes_and_a_changed_one_names_position_and_pieces() {
        let tok = words();
        let f = fixture(&[0, 3, 4], &[5, 6], plain("kiln warms", "models fast"));
        check(t(&tok), &f).expect("same tokenizer");
        // A vocabulary entry renamed: "warms" is no longer a word of it.
        let mut edited = words();
        edited.vocab[4] = "warmz";
        let err = check(t(&edited), &f).expect_err("edited vocabulary");
        let m = err.to_string();
        assert!(matches!(err, Error::TokenizerMismatch(_)), "{err:?}");
        assert!(
            m.contains("position 2: the reference's token 4 \"warmz\", the model's 1 \"<unk>\""),
            "{m}"
        );
        // The prompt tokenizes the same, but the continuation reads differently.
        let f = fixture(&[0, 3], &[5, 6], plain("kiln", "models fast"));
        let mut renamed = words();
        renamed.vocab[6] = "quick";
        let err = check(t(&renamed), &f).expect_err("detokenized text");
        assert!(matches!(err, Error::TokenizerMismatch(_)), "{err:?}");
        assert!(err.to_string().contains("\"models quick\""), "{err}");
    }

    #[test]
    fn a_longer_or_shorter_tokenization_says_where_it_ends() {
        let tok = words();
        let f = fixture(&[0, 3], &[5], plain("kiln warms", "models"));
        let m = check(t(&tok), &f).expect_err("longer").to_string();
        assert!(
            m.contains("position 2: the reference's token (the end), the model's 4"),
            "{m}"
        );
    }

    #[test]
    fn chat_messages_are_rendered_by_the_bound_template_only() {
        let tok = words();
        let template = sha256_bytes(b"{role} {content}");
        let chat = TextFixture {
            prompt: Some("user kiln".into()),
            chat: Some(r#"[{"role": "user", "content": "kiln"}]"#.into()),
            chat_template_sha256: Some(template.clone()),
            continuation: None,
        };
        check(t(&tok), &fixture(&[2, 3], &[5], chat.clone())).expect("same template");
        let mut changed = words();
        changed.template = Some("{role}: {content}");
        let err = check(t(&changed), &fixture(&[2, 3], &[5], chat.clone()))
            .expect_err("changed template");
        assert!(matches!(err, Error::ChatTemplateMismatch(_)), "{err:?}");
        assert!(err.to_string().contains(&template), "{err}");
        changed.template = None;
        let err = check(t(&changed), &fixture(&[2, 3], &[5], chat)).expect_err("none");
        assert!(matches!(err, Error::ChatTemplateMismatch(_)), "{err:?}");
    }

    #[test]
    fn text_on_an_engine_without_a_tokenizer_and_bad_messages_are_refused() {
        let f = fixture(&[0], &[1], plain("kiln", "x"));
        let err = check(None, &f).expect_err("no tokenizer");
        assert!(matches!(err, Error::InvalidSpec(_)), "{err:?}");
        check(None, &fixture(&[0], &[1], TextFixture::default())).expect("no text, no check");
        for bad in [
            "{}",
            "[]",
            r#"[{"role": "user"}]"#,
            r#"[{"role": "u", "content": "a\u0000"}]"#,
        ] {
            assert!(messages(bad).is_err(), "{bad}");
        }
    }
}
