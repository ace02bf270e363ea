//! OpenAI-compatible and Anthropic Messages request bodies: which API a path is, and the model
//! and prompt text a request carries. The body is parsed exactly once per request.

mod json;
mod text;

use crate::error_response::{ErrorShape, RequestError};
use json::{Content, Item, Message, Prompt};
use serde::Deserialize;
use std::borrow::Cow;

/// Characters per token used for estimates; the usual figure for English BPE tokenizers.
pub const CHARS_PER_TOKEN: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Completions,
    ChatCompletions,
    Embeddings,
    Responses,
    /// Anthropic's Messages API (`/v1/messages`), as vLLM serves it.
    Messages,
    /// Any other path (`/v1/models`, health checks): routed without reading a body.
    Other,
}

impl ApiKind {
    /// The API a request path names, as the model server's router will see it (see
    /// [`normalized_path`]): `/v1/%63ompletions` and `//v1/./completions/` are completions.
    pub fn from_path(path: &[u8]) -> ApiKind {
        match normalized_path(path).as_ref() {
            b"/v1/completions" => ApiKind::Completions,
            b"/v1/chat/completions" => ApiKind::ChatCompletions,
            b"/v1/embeddings" => ApiKind::Embeddings,
            b"/v1/responses" => ApiKind::Responses,
            b"/v1/messages" => ApiKind::Messages,
            _ => ApiKind::Other,
        }
    }

    pub fn is_inference(self) -> bool {
        self != ApiKind::Other
    }

    /// The error body clients of this API can read: Anthropic's SDKs do not parse OpenAI's.
    pub fn error_shape(self) -> ErrorShape {
        match self {
            ApiKind::Messages => ErrorShape::Anthropic,
            _ => ErrorShape::OpenAi,
        }
    }

    /// The body field that carries the prompt.
    fn prompt_field(self) -> &'static str {
        match self {
            ApiKind::Completions => "prompt",
            ApiKind::ChatCompletions | ApiKind::Messages => "messages",
            ApiKind::Embeddings | ApiKind::Responses => "input",
            ApiKind::Other => "",
        }
    }
}

/// A request path as a server routes it: query and fragment cut, percent-escapes decoded once
/// (servers such as uvicorn decode `%2F` too), empty and `.` segments dropped, `..` resolved,
/// no trailing slash. Borrowed when the path is already in that form, as nearly every one is.
pub fn normalized_path(raw: &[u8]) -> Cow<'_, [u8]> {
    let end = raw
        .iter()
        .position(|&b| b == b'?' || b == b'#')
        .unwrap_or(raw.len());
    let path = raw.get(..end).unwrap_or_default();
    let plain = !path.contains(&b'%')
        && !path.windows(2).any(|w| w == b"//" || w == b"/.")
        && path.last() != Some(&b'/');
    if plain {
        return Cow::Borrowed(path);
    }
    let decoded = percent_decoded(path);
    let mut segments: Vec<&[u8]> = Vec::new();
    for segment in decoded.split(|&b| b == b'/') {
        match segment {
            b"" | b"." => {}
            b".." => {
                segments.pop();
            }
            segment => segments.push(segment),
        }
    }
    let mut normalized = Vec::with_capacity(decoded.len());
    for segment in segments {
        normalized.push(b'/');
        normalized.extend_from_slice(segment);
    }
    Cow::Owned(normalized)
}

fn percent_decoded(path: &[u8]) -> Vec<u8> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        let escaped = (b == b'%')
            .then(|| Some((hex(*path.get(i + 1)?)?, hex(*path.get(i + 2)?)?)))
            .flatten();
        match escaped {
            Some((high, low)) => {
                out.push(u8::try_from(high * 16 + low).unwrap_or(b'%'));
                i += 3;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// Output tokens assumed when a request sets no `max_tokens`.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 256;

/// The protocol's request headers that steer scheduling, read once when headers arrive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestHeaders {
    /// `x-session-token`: the endpoint an earlier response of this session named.
    pub session_token: Option<String>,
    /// `test-epp-endpoint-selection`: addresses the testing filter restricts the pick to.
    pub test_endpoint_selection: Option<String>,
    /// `x-gateway-inference-objective`: names an objective declared in `pool.objectives`.
    pub objective: Option<String>,
    /// `x-gateway-model-name-rewrite`: the model the request is scheduled and served as.
    pub model_rewrite: Option<String>,
    /// The proxy's subset hint (filter metadata `envoy.lb_subset_hint`,
    /// `x-gateway-destination-endpoint-subset`): the only addresses the pick may choose from;
    /// empty means none may serve it.
    pub subset_hint: Option<Vec<String>>,
    /// `epp-profile`: the profile `header-profile-handler` runs.
    pub profile: Option<String>,
    /// `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms` (or their `x-slo-` names), for the
    /// latency plugins.
    pub slo_ttft_ms: Option<f64>,
    pub slo_tpot_ms: Option<f64>,
}

/// What scheduling needs to know about one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InferenceRequest {
    pub model: String,
    pub headers: RequestHeaders,
    /// From the objective; 0 when none is named. Negative means sheddable.
    pub priority: i32,
    /// The text prefix-cache hashing runs over (chat messages rendered as `role: content` lines).
    pub prompt: String,
    pub prompt_chars: usize,
    /// Characters of `prompt` before its first assistant turn, when it has one: a continuing
    /// conversation's opening (its system prompt and first user message), the same in every
    /// later turn, which names the conversation for prefix homes.
    pub opening_chars: Option<usize>,
    /// Characters of `prompt` in its leading system prompt (system or developer turns,
    /// Anthropic's `system`, the Responses API's `instructions`) when a conversation follows
    /// it: text every request of one application shares.
    pub system_chars: Option<usize>,
    pub prompt_tokens: u32,
    pub max_tokens: Option<u32>,
    pub stream: bool,
}

impl InferenceRequest {
    /// A request with no body (e.g. `GET /v1/models`).
    pub fn empty() -> Self {
        InferenceRequest::default()
    }

    pub fn output_tokens(&self) -> u32 {
        self.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS)
    }

    /// The KV-cache footprint the request will reach: prompt plus expected output tokens.
    pub fn total_tokens(&self) -> u64 {
        u64::from(self.prompt_tokens) + u64::from(self.output_tokens())
    }
}

/// The body with its `model` replaced, for `x-gateway-model-name-rewrite`. Only runs when the
/// header is present, on a body that already parsed.
pub fn rewrite_model(body: &[u8], model: &str) -> Result<Vec<u8>, RequestError> {
    let mut document = body_document(body)?;
    document.insert("model".into(), serde_json::Value::String(model.into()));
    document_bytes(&document)
}

/// A JSON request body as a document, to rewrite.
pub fn body_document(
    body: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, RequestError> {
    serde_json::from_slice(body)
        .map_err(|error| RequestError::BadRequest(format!("request body is not valid: {error}")))
}

/// A rewritten document as the body to forward.
pub fn document_bytes(
    document: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<u8>, RequestError> {
    serde_json::to_vec(document).map_err(|error| {
        RequestError::BadRequest(format!("request body cannot be rewritten: {error}"))
    })
}

#[derive(Deserialize)]
struct Body<'a> {
    model: Option<String>,
    #[serde(borrow)]
    prompt: Option<Prompt<'a>>,
    #[serde(borrow)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(borrow)]
    input: Option<Prompt<'a>>,
    #[serde(borrow)]
    instructions: Option<Cow<'a, str>>,
    /// Anthropic's system prompt, outside `messages`: a string or text blocks.
    #[serde(borrow)]
    system: Option<Content<'a>>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    max_output_tokens: Option<u32>,
    stream: Option<bool>,
}

/// Parses a body for `kind`. Errors are the client's: they become 400 replies.
pub fn parse_body(kind: ApiKind, body: &[u8]) -> Result<InferenceRequest, RequestError> {
    parse_body_keeping(kind, body, usize::MAX)
}

/// [`parse_body`], keeping only the first `keep_chars` characters of the prompt's text (what
/// the prefix index hashes; see `Scheduler::prompt_chars_needed`): the rest is counted for
/// the token estimate but never copied.
pub fn parse_body_keeping(
    kind: ApiKind,
    body: &[u8],
    keep_chars: usize,
) -> Result<InferenceRequest, RequestError> {
    if body.is_empty() {
        return Err(RequestError::BadRequest(
            "request body is empty; expected a JSON object".into(),
        ));
    }
    // No nesting pre-scan: the typed fields bound how deep the parser goes into what it reads
    // (anything deeper is the wrong type), and serde_json skips other fields without recursion.
    let mut parsed: Body = serde_json::from_slice(body)
        .map_err(|error| RequestError::BadRequest(format!("request body is not valid: {error}")))?;
    let model = match parsed.model.take() {
        Some(model) if !model.trim().is_empty() => model,
        Some(_) => {
            return Err(RequestError::BadRequest(
                "\"model\" must not be empty".into(),
            ))
        }
        None => {
            return Err(RequestError::BadRequest(
                "missing required field \"model\"".into(),
            ))
        }
    };
    let mut text = PromptText::new(keep_chars);
    let token_ids = prompt_text(kind, &parsed, &mut text)?;
    let system_chars = text.system_prompt_chars();
    let (prompt, prompt_chars, opening_chars) = (text.text, text.chars, text.opening);
    let estimated = prompt_chars.div_ceil(CHARS_PER_TOKEN);
    let prompt_tokens = u32::try_from(token_ids.unwrap_or(estimated)).unwrap_or(u32::MAX);
    let max_tokens = match kind {
        // Anthropic has one budget field and requires it; vLLM refuses the request without it,
        // so the picker says why before a pod is spent on it.
        ApiKind::Messages => Some(parsed.max_tokens.ok_or_else(|| {
            RequestError::BadRequest(
                "missing required field \"max_tokens\" (the Messages API requires an output token budget)"
                    .into(),
            )
        })?),
        _ => parsed
            .max_completion_tokens
            .or(parsed.max_tokens)
            .or(parsed.max_output_tokens),
    };
    Ok(InferenceRequest {
        model,
        headers: RequestHeaders::default(),
        priority: 0,
        prompt,
        prompt_chars,
        opening_chars,
        system_chars,
        prompt_tokens,
        max_tokens,
        stream: parsed.stream.unwrap_or(false),
    })
}

/// The prompt text, and the exact token count when the client sent token ids.
/// The prompt's text as the prefix index reads it, kept up to `keep` characters; every
/// character pushed counts toward `chars`, kept or not.
struct PromptText {
    text: String,
    keep: usize,
    kept: usize,
    chars: usize,
    /// `chars` when the first assistant turn began.
    opening: Option<usize>,
    /// `chars` when the first turn that is not a system prompt began.
    conversation: Option<usize>,
}

impl PromptText {
    fn new(keep: usize) -> Self {
        PromptText {
            text: String::new(),
            keep,
            kept: 0,
            chars: 0,
            opening: None,
            conversation: None,
        }
    }

    /// Marks where the conversation begins, if it has not yet: everything before is the
    /// system prompt.
    fn begin_conversation(&mut self) {
        if self.conversation.is_none() {
            self.conversation = Some(self.chars);
        }
    }

    fn system_prompt_chars(&self) -> Option<usize> {
        self.conversation.filter(|&chars| chars > 0)
    }

    fn push_str(&mut self, value: &str) {
        let room = self.keep.saturating_sub(self.kept);
        if room == 0 {
            self.chars += text::char_count(value);
            return;
        }
        // A value no longer in bytes than the room fits whole (a char is at least a byte);
        // otherwise the kept part is cut where its characters end and the rest only counted.
        let end = if value.len() <= room {
            None
        } else {
            text::offset_of_char(value, room)
        };
        match end {
            None => {
                let count = text::char_count(value);
                self.text.push_str(value);
                self.kept += count;
                self.chars += count;
            }
            Some(end) => {
                let (kept, rest) = value.split_at(end);
                self.text.push_str(kept);
                self.kept += room;
                self.chars += room + text::char_count(rest);
            }
        }
    }

    fn push(&mut self, c: char) {
        self.push_str(c.encode_utf8(&mut [0; 4]));
    }
}

impl std::fmt::Write for PromptText {
    fn write_str(&mut self, value: &str) -> std::fmt::Result {
        self.push_str(value);
        Ok(())
    }
}

fn prompt_text(
    kind: ApiKind,
    body: &Body,
    text: &mut PromptText,
) -> Result<Option<usize>, RequestError> {
    let field = kind.prompt_field();
    let missing = || RequestError::BadRequest(format!("missing required field \"{field}\""));
    let token_ids = match kind {
        ApiKind::Completions | ApiKind::Embeddings => {
            let prompt = match kind {
                ApiKind::Completions => body.prompt.as_ref(),
                _ => body.input.as_ref(),
            };
            append_prompt(text, prompt.ok_or_else(missing)?, field, false)?
        }
        ApiKind::ChatCompletions => {
            append_messages(text, body.messages.as_deref().ok_or_else(missing)?);
            None
        }
        ApiKind::Messages => {
            let messages = body.messages.as_deref().ok_or_else(missing)?;
            if messages.is_empty() {
                return Err(RequestError::BadRequest(
                    "\"messages\" must hold at least one message".into(),
                ));
            }
            // Rendered as a leading system turn, as a chat request with the same system prompt
            // would be, so the two share prefix-cache blocks on the same pod.
            if let Some(system) = &body.system {
                append_content(text, "system", Some(system));
            }
            append_messages(text, messages);
            None
        }
        ApiKind::Responses => {
            if let Some(instructions) = &body.instructions {
                push_line(text, "system", instructions);
                text.begin_conversation();
            }
            append_prompt(text, body.input.as_ref().ok_or_else(missing)?, field, true)?
        }
        ApiKind::Other => None,
    };
    Ok(token_ids)
}

/// Appends a prompt: a string, a list of strings, token ids, lists of token ids, or (when
/// `messages_allowed`) message items. Returns the token count when it is exact.
fn append_prompt(
    text: &mut PromptText,
    prompt: &Prompt,
    field: &str,
    messages_allowed: bool,
) -> Result<Option<usize>, RequestError> {
    let items = match prompt {
        Prompt::Text(value) => {
            text.push_str(value);
            return Ok(None);
        }
        Prompt::List(items) => items,
    };
    let same = |kind: fn(&Item) -> bool| items.iter().all(kind);
    if same(|i| matches!(i, Item::Text(_))) {
        for item in items {
            if let Item::Text(value) = item {
                text.push_str(value);
            }
        }
        return Ok(None);
    }
    if same(|i| matches!(i, Item::Token(_) | Item::Tokens(_))) {
        let ids: usize = items
            .iter()
            .map(|item| match item {
                Item::Token(id) => append_token_ids(text, std::slice::from_ref(id)),
                Item::Tokens(ids) => append_token_ids(text, ids),
                _ => 0,
            })
            .sum();
        return Ok(Some(ids));
    }
    if messages_allowed && same(|i| matches!(i, Item::Message(_))) {
        for item in items {
            if let Item::Message(message) = item {
                append_message(text, message);
            }
        }
        return Ok(None);
    }
    Err(RequestError::BadRequest(format!(
        "\"{field}\" must be a string, a list of strings or token ids{}",
        if messages_allowed {
            ", or a list of messages"
        } else {
            ""
        }
    )))
}

/// Token ids are hashed as their decimal text so a repeated token prefix still matches.
fn append_token_ids(text: &mut PromptText, ids: &[u32]) -> usize {
    use std::fmt::Write;
    for id in ids {
        let _ = write!(text, "{id} ");
    }
    ids.len()
}

fn append_messages(text: &mut PromptText, messages: &[Message]) {
    for message in messages {
        append_message(text, message);
    }
}

fn append_message(text: &mut PromptText, message: &Message) {
    if !matches!(message.role.as_ref(), "system" | "developer") {
        text.begin_conversation();
    }
    if message.role == "assistant" && text.opening.is_none() {
        text.opening = Some(text.chars);
    }
    append_content(text, &message.role, message.content.as_ref());
}

/// One turn as a `role: content` line; only the text of content parts (OpenAI's parts,
/// Anthropic's blocks) counts, images and tool blocks carry none.
fn append_content(text: &mut PromptText, role: &str, content: Option<&Content>) {
    match content {
        Some(Content::Text(content)) => push_line(text, role, content),
        Some(Content::Parts(parts)) => {
            text.push_str(role);
            text.push_str(": ");
            for part in parts {
                text.push_str(part.text.as_deref().unwrap_or(""));
            }
            text.push('\n');
        }
        None => push_line(text, role, ""),
    }
}

fn push_line(text: &mut PromptText, role: &str, content: &str) {
    text.push_str(role);
    text.push_str(": ");
    text.push_str(content);
    text.push('\n');
}

#[cfg(test)]
mod tests;
