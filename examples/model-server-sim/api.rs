//! The OpenAI-compatible API and Anthropic's Messages API as vLLM serves them: request parsing
//! (completions, chat completions, embeddings, responses, messages), the prompt's tokens, and
//! the response bodies and events.

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
    /// Anthropic's Messages API: chat turns, answered in Anthropic's shapes.
    Messages,
}

impl Api {
    pub fn from_path(path: &str) -> Option<Api> {
        match path.trim_end_matches('/') {
            "/v1/completions" => Some(Api::Completions),
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/embeddings" => Some(Api::Embeddings),
            "/v1/responses" => Some(Api::Responses),
            "/v1/messages" => Some(Api::Messages),
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
    /// vLLM's `priority` (lower runs first under `--scheduling-policy priority`): counted in
    /// the stats, so tests see what a gateway forwarded.
    pub priority: Option<i64>,
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
        Api::Messages => messages_prompt(&fields)?,
    };
    let max_tokens = match api {
        // Anthropic's only output budget, and a required one (vLLM refuses a request without).
        Api::Messages => match required(&fields, "max_tokens")? {
            Value::Number(n) => Some(n.as_u64().ok_or("\"max_tokens\" must be a whole number")?),
            _ => return Err("\"max_tokens\" must be a whole number".into()),
        },
        _ => ["max_completion_tokens", "max_tokens", "max_output_tokens"]
            .iter()
            .find_map(|name| fields.get(*name).and_then(Value::as_u64)),
    };
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(stream)) => *stream,
        Some(_) => return Err("\"stream\" must be a boolean".into()),
    };
    let priority = match fields.get("priority") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(n.as_i64().ok_or("\"priority\" must be an integer")?),
        Some(_) => return Err("\"priority\" must be an integer".into()),
    };
    Ok(ApiRequest {
        api,
        model,
        prompt,
        max_tokens,
        stream,
        priority,
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
            let content = content_text(item.get("content"))
                .ok_or_else(|| wrong("has a message whose content is not text"))?;
            Ok(Message {
                role: role.to_string(),
                content,
            })
        })
        .collect()
}

/// A turn's text: a string, null, or parts / content blocks whose text is joined (images and
/// tool blocks have none). `None` for any other value.
fn content_text(content: Option<&Value>) -> Option<String> {
    match content {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(parts)) => Some(
            parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(_) => None,
    }
}

/// The Messages API: `system` (a string or text blocks) becomes the system turn, as vLLM's
/// Anthropic endpoint renders it through the chat template; `messages` must not be empty.
fn messages_prompt(fields: &Map<String, Value>) -> Result<Prompt, String> {
    let mut turns = Vec::new();
    if let Some(system) = fields.get("system") {
        let content = content_text(Some(system))
            .ok_or("\"system\" must be a string or a list of text blocks")?;
        turns.push(Message {
            role: "system".into(),
            content,
        });
    }
    let conversation = messages(required(fields, "messages")?, "messages")?;
    if conversation.is_empty() {
        return Err("\"messages\" must hold at least one message".into());
    }
    turns.extend(conversation);
    Ok(Prompt::Chat(turns))
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

/// Why a Messages response stopped: the budget, or (past the simulator's cap) the model's
/// own end of turn.
fn stop_reason(request: &ApiRequest, output_tokens: usize) -> &'static str {
    if request
        .max_tokens
        .is_some_and(|max| output_tokens as u64 >= max)
    {
        "max_tokens"
    } else {
        "end_turn"
    }
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
        Api::Messages => json!({"id": id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason(request, output_tokens), "stop_sequence": Value::Null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": output_tokens}}),
    }
}

/// One Anthropic server-sent event: its name, and the same name as the data's `type`.
fn named_event(data: &Value) -> String {
    let name = data.get("type").and_then(Value::as_str).unwrap_or("");
    format!("event: {name}\ndata: {data}\n\n")
}

/// What a stream sends before its first token: for Messages the message and its text block
/// open; the OpenAI APIs send nothing.
pub fn stream_start(request: &ApiRequest, id: &str, prompt_tokens: usize) -> String {
    match request.api {
        Api::Messages => {
            let message = json!({"id": id, "type": "message", "role": "assistant",
                "model": request.model, "content": [], "stop_reason": Value::Null,
                "stop_sequence": Value::Null,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}});
            named_event(&json!({"type": "message_start", "message": message}))
                + &named_event(&json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}))
        }
        _ => String::new(),
    }
}

/// What a stream sends after its last token: `[DONE]`, or for Messages the block's and the
/// message's end with the output usage.
pub fn stream_end(request: &ApiRequest, output_tokens: usize) -> String {
    match request.api {
        Api::Messages => {
            named_event(&json!({"type": "content_block_stop", "index": 0}))
                + &named_event(&json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(request, output_tokens), "stop_sequence": Value::Null},
                    "usage": {"output_tokens": output_tokens}}))
                + &named_event(&json!({"type": "message_stop"}))
        }
        _ => STREAM_END.to_string(),
    }
}

/// One server-sent event of a stream: the `i`-th token.
pub fn stream_event(request: &ApiRequest, id: &str, i: usize) -> String {
    let model = &request.model;
    let chunk = match request.api {
        Api::Messages => {
            return named_event(&json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": word(i)}}))
        }
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

/// A refusal in the shape the API's clients read: Anthropic's for Messages.
pub fn error_for(api: Option<Api>, message: &str, kind: &str, code: u16) -> Value {
    if api != Some(Api::Messages) {
        return error_body(message, kind, code);
    }
    let kind = match code {
        400 => "invalid_request_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
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
    fn messages_render_system_and_text_blocks_through_the_chat_template() {
        let body = r#"{"model":"m","max_tokens":3,"system":[{"type":"text","text":"Rules."}],
            "messages":[{"role":"user","content":[{"type":"text","text":"Hi"},
            {"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}},
            {"type":"text","text":"there"}]}]}"#;
        let request = parse_str(Api::Messages, body).unwrap();
        let chat = parse_str(
            Api::Chat,
            r#"{"model":"m","messages":[{"role":"system","content":"Rules."},{"role":"user","content":"Hi\nthere"}]}"#,
        )
        .unwrap();
        assert_eq!(request.prompt, chat.prompt);
        assert_eq!(request.prompt_tokens(), chat.prompt_tokens());
        assert_eq!(request.output_tokens(), 3);
        let full = full_response(&request, "msg_1", 9, 3);
        assert_eq!(
            (
                &full["type"],
                &full["stop_reason"],
                &full["usage"]["input_tokens"]
            ),
            (&json!("message"), &json!("max_tokens"), &json!(9))
        );
        assert_eq!(full["content"][0]["text"], " tok0 tok1 tok2");
        let events = stream_start(&request, "msg_1", 9)
            + &stream_event(&request, "msg_1", 0)
            + &stream_end(&request, 1);
        let names: Vec<&str> = events
            .lines()
            .filter_map(|line| line.strip_prefix("event: "))
            .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert!(!events.contains("[DONE]"));
        let error = parse_str(
            Api::Messages,
            r#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#,
        )
        .unwrap_err();
        assert!(error.contains("\"max_tokens\""), "{error}");
        let body = error_for(Some(Api::Messages), &error, "invalid_request_error", 400);
        assert_eq!(
            (&body["type"], &body["error"]["type"]),
            (&json!("error"), &json!("invalid_request_error"))
        );
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
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
    }
}
