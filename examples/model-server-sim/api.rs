//! The OpenAI-compatible API as vLLM serves it: request parsing (completions, chat
//! completions, embeddings, responses), the prompt's tokens, and the response bodies.

use crate::tokenizer::{self, Message, BEGIN_OF_TEXT};
use serde_json::{json, Map, Value};

/// Output tokens when a request sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u64 = 16;
/// Longest generation the simulator runs.
pub const MAX_TOKENS_CAP: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
    Embeddings,
    Responses,
}

impl Api {
    pub fn from_path(path: &str) -> Option<Api> {
        match path.trim_end_matches('/') {
            "/v1/completions" => Some(Api::Completions),
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/embeddings" => Some(Api::Embeddings),
            "/v1/responses" => Some(Api::Responses),
            _ => None,
        }
    }
}

/// What the client asked the model to read.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Plain text: the tokenizer adds `<|begin_of_text|>`, as vLLM does for Llama.
    Text(String),
    /// Token ids sent by the client, used as they are.
    Tokens(Vec<u32>),
    /// Chat turns, rendered through the chat template before tokenizing.
    Chat(Vec<Message>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub api: Api,
    pub model: String,
    pub prompt: Prompt,
    pub max_tokens: Option<u64>,
    pub stream: bool,
}

impl ApiRequest {
    /// Tokens the engine generates: none for embeddings, else `max_tokens` (default 16).
    pub fn output_tokens(&self) -> usize {
        match self.api {
            Api::Embeddings => 0,
            _ => self
                .max_tokens
                .unwrap_or(DEFAULT_MAX_TOKENS)
                .min(MAX_TOKENS_CAP) as usize,
        }
    }

    /// The prompt's tokens, after the chat template where there is one.
    pub fn prompt_tokens(&self) -> Vec<u32> {
        let mut tokens = Vec::new();
        match &self.prompt {
            Prompt::Text(text) => {
                tokens.push(BEGIN_OF_TEXT);
                tokenizer::encode_ordinary(text, &mut tokens);
            }
            Prompt::Tokens(ids) => tokens.extend_from_slice(ids),
            Prompt::Chat(messages) => {
                tokenizer::encode(&tokenizer::apply_chat_template(messages), &mut tokens)
            }
        }
        tokens
    }
}

/// Parses a request body; the error is the 400 reply's message.
pub fn parse(api: Api, body: &[u8]) -> Result<ApiRequest, String> {
    if body.is_empty() {
        return Err("request body is empty; expected a JSON object".into());
    }
    let document: Value = serde_json::from_slice(body)
        .map_err(|error| format!("request body is not valid: {error}"))?;
    let Value::Object(fields) = document else {
        return Err("request body is not valid: expected a JSON object".into());
    };
    let model = match fields.get("model") {
        Some(Value::String(model)) if !model.trim().is_empty() => model.clone(),
        Some(Value::String(_)) => return Err("\"model\" must not be empty".into()),
        Some(_) => return Err("\"model\" must be a string".into()),
        None => return Err("missing required field \"model\"".into()),
    };
    let prompt = match api {
        Api::Completions => plain_prompt(&fields, "prompt")?,
        Api::Embeddings => plain_prompt(&fields, "input")?,
        Api::Chat => Prompt::Chat(messages(required(&fields, "messages")?, "messages")?),
        Api::Responses => responses_prompt(&fields)?,
    };
    let max_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|name| fields.get(*name).and_then(Value::as_u64));
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err("\"stream\" must be a boolean".into()),
    };
    Ok(ApiRequest {
        api,
        model,
        prompt,
        max_tokens,
        stream,
    })
}

fn required<'a>(fields: &'a Map<String, Value>, name: &str) -> Result<&'a Value, String> {
    fields
        .get(name)
        .ok_or_else(|| format!("missing required field \"{name}\""))
}

/// A string, a list of strings (concatenated), token ids, or lists of token ids.
fn plain_prompt(fields: &Map<String, Value>, name: &str) -> Result<Prompt, String> {
    let wrong = || format!("\"{name}\" must be a string, a list of strings or token ids");
    match required(fields, name)? {
        Value::String(text) => Ok(Prompt::Text(text.clone())),
        Value::Array(items) if items.iter().all(Value::is_string) => Ok(Prompt::Text(
            items.iter().filter_map(Value::as_str).collect(),
        )),
        Value::Array(items) => {
            let mut ids = Vec::new();
            for item in items {
                match item {
                    Value::Array(inner) => {
                        for id in inner {
                            ids.push(token(id).ok_or_else(wrong)?);
                        }
                    }
                    id => ids.push(token(id).ok_or_else(wrong)?),
                }
            }
            Ok(Prompt::Tokens(ids))
        }
        _ => Err(wrong()),
    }
}

fn token(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|id| u32::try_from(id).ok())
}

/// Chat messages: `role` and `content` (a string, null, or parts whose text is joined).
fn messages(value: &Value, name: &str) -> Result<Vec<Message>, String> {
    let wrong = |why: &str| format!("\"{name}\" {why}");
    let Value::Array(items) = value else {
        return Err(wrong("must be a list of messages"));
    };
    items
        .iter()
        .map(|item| {
            let role = item
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| wrong("has a message without a string \"role\""))?;
            let content = match item.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(text)) => text.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                Some(_) => return Err(wrong("has a message whose content is not text")),
            };
            Ok(Message {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// The Responses API: `instructions` become the system turn; `input` is a string (one user
/// turn) or a list of messages.
fn responses_prompt(fields: &Map<String, Value>) -> Result<Prompt, String> {
    let mut turns = Vec::new();
    if let Some(instructions) = fields.get("instructions").and_then(Value::as_str) {
        turns.push(Message {
            role: "system".into(),
            content: instructions.to_string(),
        });
    }
    match required(fields, "input")? {
        Value::String(text) => turns.push(Message {
            role: "user".into(),
            content: text.clone(),
        }),
        list @ Value::Array(_) => turns.extend(messages(list, "input")?),
        _ => return Err("\"input\" must be a string or a list of messages".into()),
    }
    Ok(Prompt::Chat(turns))
}

/// The `i`-th generated token's text.
pub fn word(i: usize) -> String {
    format!(" tok{i}")
}

/// A whole (non-streamed) response.
pub fn full_response(
    request: &ApiRequest,
    id: &str,
    prompt_tokens: usize,
    output_tokens: usize,
) -> Value {
    let text: String = (0..output_tokens).map(word).collect();
    let model = &request.model;
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": output_tokens,
        "total_tokens": prompt_tokens + output_tokens});
    match request.api {
        Api::Chat => json!({"id": id, "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": usage}),
        Api::Embeddings => {
            let vector: Vec<f64> = (0..8)
                .map(|i| ((prompt_tokens + i) % 7) as f64 / 7.0)
                .collect();
            json!({"object": "list", "model": model, "data": [{"object": "embedding", "index": 0, "embedding": vector}],
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}})
        }
        Api::Responses => {
            json!({"id": id, "object": "response", "model": model, "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
            "usage": {"input_tokens": prompt_tokens, "output_tokens": output_tokens}})
        }
        Api::Completions => json!({"id": id, "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}], "usage": usage}),
    }
}

/// One server-sent event of a stream: the `i`-th token.
pub fn stream_event(request: &ApiRequest, id: &str, i: usize) -> String {
    let model = &request.model;
    let chunk = match request.api {
        Api::Chat => json!({"id": id, "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": {"content": word(i)}, "finish_reason": Value::Null}]}),
        _ => json!({"id": id, "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": word(i), "finish_reason": Value::Null}]}),
    };
    format!("data: {chunk}\n\n")
}

pub const STREAM_END: &str = "data: [DONE]\n\n";

pub fn error_body(message: &str, kind: &str, code: u16) -> Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{END_OF_TURN, START_HEADER};

    fn parse_str(api: Api, body: &str) -> Result<ApiRequest, String> {
        parse(api, body.as_bytes())
    }

    #[test]
    fn completions_text_lists_and_token_ids() {
        let request = parse_str(
            Api::Completions,
            r#"{"model":"m","prompt":"Hello world","max_tokens":8,"stream":true}"#,
        )
        .unwrap();
        assert_eq!(request.prompt, Prompt::Text("Hello world".into()));
        assert_eq!((request.max_tokens, request.stream), (Some(8), true));
        let tokens = request.prompt_tokens();
        assert_eq!((tokens[0], tokens.len()), (BEGIN_OF_TEXT, 3));
        let request = parse_str(Api::Completions, r#"{"model":"m","prompt":["ab","cd"]}"#).unwrap();
        assert_eq!(request.prompt, Prompt::Text("abcd".into()));
        assert_eq!(request.output_tokens(), 16);
        let request = parse_str(Api::Completions, r#"{"model":"m","prompt":[[1,2],[3]]}"#).unwrap();
        assert_eq!(request.prompt_tokens(), [1, 2, 3]);
    }

    #[test]
    fn chat_is_templated_before_tokenizing() {
        let body = r#"{"model":"m","max_completion_tokens":5,"messages":[
            {"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]},
            {"role":"assistant","content":null}]}"#;
        let request = parse_str(Api::Chat, body).unwrap();
        let Prompt::Chat(turns) = &request.prompt else {
            panic!("{request:?}")
        };
        assert_eq!(turns[1].content, "Hi\nthere");
        assert_eq!(request.output_tokens(), 5);
        let tokens = request.prompt_tokens();
        assert_eq!(tokens[..2], [BEGIN_OF_TEXT, START_HEADER]);
        assert_eq!(tokens.iter().filter(|&&t| t == END_OF_TURN).count(), 3);
    }

    #[test]
    fn responses_and_embeddings() {
        let body = r#"{"model":"r","instructions":"Be kind.","input":[{"role":"user","content":[{"type":"input_text","text":"Hey"}]}],"max_output_tokens":9}"#;
        let request = parse_str(Api::Responses, body).unwrap();
        assert_eq!(
            request.prompt,
            Prompt::Chat(vec![
                Message {
                    role: "system".into(),
                    content: "Be kind.".into()
                },
                Message {
                    role: "user".into(),
                    content: "Hey".into()
                }
            ])
        );
        assert_eq!(request.max_tokens, Some(9));
        let request = parse_str(Api::Embeddings, r#"{"model":"e","input":"x"}"#).unwrap();
        assert_eq!(request.output_tokens(), 0);
    }

    #[test]
    fn client_errors() {
        let cases = [
            (Api::Completions, "", "empty"),
            (Api::Completions, "{not json", "not valid"),
            (Api::Completions, "[1]", "JSON object"),
            (Api::Completions, r#"{"prompt":"x"}"#, "\"model\""),
            (Api::Completions, r#"{"model":"","prompt":"x"}"#, "empty"),
            (Api::Completions, r#"{"model":5,"prompt":"x"}"#, "string"),
            (
                Api::Completions,
                r#"{"model":"m","prompt":["a",1]}"#,
                "must be",
            ),
            (Api::Chat, r#"{"model":"m"}"#, "\"messages\""),
            (
                Api::Chat,
                r#"{"model":"m","messages":{}}"#,
                "list of messages",
            ),
            (
                Api::Chat,
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                "role",
            ),
            (Api::Embeddings, r#"{"model":"m"}"#, "\"input\""),
            (
                Api::Completions,
                r#"{"model":"m","prompt":"x","stream":"yes"}"#,
                "boolean",
            ),
        ];
        for (api, body, needle) in cases {
            let error = parse_str(api, body).unwrap_err();
            assert!(error.contains(needle), "{body}: {error}");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(Api::from_path("/v1/chat/completions/"), Some(Api::Chat));
        assert_eq!(Api::from_path("/v1/models"), None);
    }
}
